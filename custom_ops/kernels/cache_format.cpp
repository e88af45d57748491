#include "cache_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "numeric.hpp"
#include "validate.hpp"

namespace mla {

KvDtype kv_dtype_from_name(const char* op, const std::string& name) {
    if (name.empty() || name == "auto") return KvDtype::automatic;
    KvDtype found = KvDtype::automatic;
    std::string names;
    for_each_format([&](auto f) {
        using F = decltype(f);
        if (name == F::name) found = F::kind;
        names += names.empty() ? F::name : std::string(", ") + F::name;
    });
    if (found == KvDtype::automatic)
        throw Error(std::string(op) + ": attribute 'kv_dtype' must be one of " + names + " (or empty), got '" + name +
                    "'");
    return found;
}

const char* kv_dtype_name(KvDtype t) {
    const char* name = "auto";
    with_format(t, [&](auto f) { name = decltype(f)::name; });
    return name;
}

int64_t scale_groups(KvDtype t) {
    int64_t g = 0;
    with_format(t, [&](auto f) { g = decltype(f)::groups; });
    return g;
}

int64_t row_bytes(KvDtype t, int64_t r, int64_t dr) {
    int64_t bytes = 0;
    with_format(t, [&](auto f) {
        using F = decltype(f);
        bytes = F::groups > 0 ? r + 4 * F::groups + 2 * dr : (r + dr) * dtype_size(F::elem);
    });
    return bytes;
}

namespace {

DType elem_of(KvDtype t) {
    DType e = DType::u8;
    with_format(t, [&](auto f) { e = decltype(f)::elem; });
    return e;
}

// One quantised row: each group's codes and scale, then k_pe as bf16 (cache_format.hpp).
template <class F>
void store_codes(const CacheRows& c, const float* src, char* p) {
    using Code = typename F::Code;
    const RowFormat& f = c.format;
    const int64_t gs = f.group_size();
    for (int64_t g = 0; g < F::groups; ++g) {
        const float* x = src + g * gs;
        float amax = 0.f;
        bool finite = true;
        for (int64_t i = 0; i < gs; ++i) {
            if (!std::isfinite(x[i])) finite = false;
            amax = std::max(amax, std::fabs(x[i]));
        }
        const float scale = finite ? amax / Code::top : std::numeric_limits<float>::quiet_NaN();
        const bool zero = !finite || scale == 0.f;  // codes 0: the scale alone says what the group is
        auto* q = reinterpret_cast<typename Code::Storage*>(p) + g * gs;
        for (int64_t i = 0; i < gs; ++i) q[i] = zero ? 0 : Code::encode(x[i] / scale);
        std::memcpy(p + f.scale_offset() + 4 * g, &scale, 4);
    }
    from_f32(src + f.rank, DType::bf16, p + f.kpe_offset(), c.width - f.rank);
}

}  // namespace

CacheRows cache_rows(const char* op, const TensorView& c, KvDtype kind, int64_t rank, bool writable) {
    check_rank(op, c, 3);
    if (kind == KvDtype::automatic) {  // the float format of the tensor's type; u8 bytes: bf16 rows
        const DType by = c.dtype == DType::u8 ? DType::bf16 : c.dtype;
        std::string types;
        for_each_format([&](auto f) {
            using F = decltype(f);
            if (F::groups > 0) return;
            if (F::elem == by) kind = F::kind;
            types += std::string(dtype_name(F::elem)) + ", ";
        });
        if (kind == KvDtype::automatic)
            fail(op, c, "must be " + types + "or u8 bytes of bf16 rows, got " + dtype_name(c.dtype));
    }
    CacheRows out;
    out.kind = kind;
    out.elem = elem_of(kind);
    out.quantised = quantised(kind);
    out.base = static_cast<char*>(c.data);
    out.logical = c;
    const std::string what = std::string("(kv_dtype ") + kv_dtype_name(kind) + ")";
    if (c.dtype != out.elem && c.dtype != DType::u8)
        fail(op, c, "must be " + std::string(dtype_name(out.elem)) + " or its u8 bytes " + what + ", got " +
                        dtype_name(c.dtype));
    if (c.dim(1) < 1) fail(op, c, "must have a block size of at least 1, got shape " + shape_str(c.shape));
    if (c.numel() > 0 && c.data == nullptr) fail(op, c, "has no data");
    if (!out.quantised) {
        int64_t w = c.dim(2);
        if (c.dtype == DType::u8 && out.elem != DType::u8) {
            const int64_t esz = dtype_size(out.elem);
            if (c.dim(2) % esz != 0)
                fail(op, c, "of bytes " + what + " must have a last dimension divisible by " + std::to_string(esz) +
                                ", got shape " + shape_str(c.shape));
            w = c.dim(2) / esz;
        }
        out.logical.dtype = out.elem;
        out.logical.shape[2] = w;
        out.width = w;
        out.rank = w;
        out.row_bytes = w * dtype_size(out.elem);
        out.format = RowFormat{kind, w, w, 1};
        check_cache(op, out.logical, writable);
        return out;
    }
    if (c.dtype != DType::u8)
        fail(op, c, "must be u8 bytes " + what + ", got " + dtype_name(c.dtype));
    if (rank < 1)
        throw Error(std::string(op) + ": the latent rank r must be positive to read an " + kv_dtype_name(kind) +
                    " cache, got " + std::to_string(rank));
    const int64_t groups = scale_groups(kind);
    if (rank % groups != 0)
        throw Error(std::string(op) + ": an " + kv_dtype_name(kind) + " cache quantises kv_c in " +
                    std::to_string(groups) + " equal groups, so the latent rank r must be a multiple of " +
                    std::to_string(groups) + ", got " + std::to_string(rank));
    // dr = 0: rows with no bf16 part (the indexer's key cache, whose D values are all quantised).
    const int64_t rest = c.dim(2) - rank - 4 * groups;  // 2 * dr
    if (rest < 0 || rest % 2 != 0)
        fail(op, c, "must hold rows of r + 4 * G + 2 * dr bytes " + what + " with r = " + std::to_string(rank) +
                        ", G = " + std::to_string(groups) + " and dr >= 0 (codes, G f32 scales, bf16 k_pe), got shape " +
                        shape_str(c.shape));
    out.width = rank + rest / 2;
    out.rank = rank;
    out.row_bytes = c.dim(2);
    out.logical.shape[2] = out.width;
    out.format = RowFormat{kind, out.width, rank, groups};
    return out;
}

void store_row(const CacheRows& c, const float* src, void* row) {
    with_format(c.kind, [&](auto f) {
        using F = decltype(f);
        if constexpr (F::groups == 0)
            from_f32(src, F::elem, row, c.width);
        else
            store_codes<F>(c, src, static_cast<char*>(row));
    });
}

}  // namespace mla
