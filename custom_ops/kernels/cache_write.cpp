// MlaCacheWrite: scatter the new tokens' latent rows into the paged cache, in place.
#include <vector>

#include "mla_kernels.hpp"
#include "numeric.hpp"
#include "validate.hpp"

namespace mla {

static const char* kOp = "MlaCacheWrite";

int64_t cache_write(const TensorView& kv_c, const TensorView& k_pe, const TensorView& cache_in,
                    const TensorView& slots, const Threading& threading, KvDtype kv_dtype, Workspace& ws) {
    check_rank(kOp, kv_c, 2);
    check_rank(kOp, k_pe, 2);
    check_float(kOp, kv_c);
    check_float(kOp, k_pe);
    const CacheRows rows = cache_rows(kOp, cache_in, kv_dtype, kv_c.dim(1), /*writable=*/true);
    const TensorView& cache = rows.logical;
    check_index(kOp, slots);
    check_rank(kOp, slots, 1);
    const int64_t t_count = kv_c.dim(0), r = kv_c.dim(1), dr = k_pe.dim(1), width = cache.dim(2);
    check_dim(kOp, k_pe, 0, t_count, "the number of tokens T of kv_c");
    check_dim(kOp, slots, 0, t_count, "the number of tokens T of kv_c");
    if (r + dr != width)
        fail(kOp, cache, "row width " + std::to_string(width) + " must equal kv_c width " +
                             std::to_string(r) + " + k_pe width " + std::to_string(dr));
    const int64_t capacity = cache.dim(0) * cache.dim(1);
    // Every slot in range, none twice (two writers of one row would race and the survivor
    // would depend on thread timing). The marks live in the op's workspace and are cleared
    // again before returning or throwing, so a call costs O(T), not O(cache slots).
    std::vector<uint8_t>& taken = ws.slot_taken;
    if (static_cast<int64_t>(taken.size()) < capacity) taken.resize(static_cast<size_t>(capacity), 0);
    int64_t written = 0;
    auto clear_marks = [&](int64_t upto) {
        for (int64_t t = 0; t < upto; ++t) {
            const int64_t s = index_at(slots, t);
            if (s >= 0 && s < capacity) taken[static_cast<size_t>(s)] = 0;
        }
    };
    for (int64_t t = 0; t < t_count; ++t) {
        const int64_t s = index_at(slots, t);
        if (s < 0) continue;
        if (s >= capacity) {
            clear_marks(t);
            fail(kOp, slots, "holds slot " + std::to_string(s) + " at [" + std::to_string(t) +
                                 "], outside [0, " + std::to_string(capacity) +
                                 ") (num_blocks x block_size of kv_cache)");
        }
        if (taken[static_cast<size_t>(s)]) {
            clear_marks(t);
            fail(kOp, slots, "holds slot " + std::to_string(s) + " twice (again at [" + std::to_string(t) + "])");
        }
        taken[static_cast<size_t>(s)] = 1;
        ++written;
    }
    clear_marks(t_count);

    auto write_token = [&](int64_t t) {
        const int64_t s = index_at(slots, t);
        if (s < 0) return;
        float row[4096];
        std::vector<float> big;
        float* buf = row;
        if (width > 4096) {
            big.resize(static_cast<size_t>(width));
            buf = big.data();
        }
        to_f32(static_cast<const char*>(kv_c.data) + t * r * dtype_size(kv_c.dtype), kv_c.dtype, buf, r);
        to_f32(static_cast<const char*>(k_pe.data) + t * dr * dtype_size(k_pe.dtype), k_pe.dtype, buf + r, dr);
        store_row(rows, buf, rows.base + s * rows.row_bytes);
    };
    if (t_count >= 64)
        threading.parallel_for(t_count, write_token);
    else
        for (int64_t t = 0; t < t_count; ++t) write_token(t);
    return written;
}

}  // namespace mla
