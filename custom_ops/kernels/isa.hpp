// The few compute primitives whose speed depends on the instruction set. Each is compiled once
// per target from the same source (isa_impl.hpp): isa_avx512.cpp (-mavx512f/bw/vl/dq, 16 lanes),
// isa_avx2.cpp (-mavx2 -mfma -mf16c, 8 lanes) and isa_generic.cpp (the baseline), and one table
// is picked at run time for the CPU at hand (kernel_config.hpp: `isa()` is the one in use). A new
// instruction set is one isa_<name>.cpp that sets the lane width and tile shapes and includes
// isa_impl.hpp, its qgemm_<name>.cpp, its line in kernel_config.cpp and CMakeLists.txt.
#pragma once

#include <cstdint>

#include "mla_tensor.hpp"
#include "row_format.hpp"

namespace mla {

// Software prefetch of the next chunk's cache rows, issued a few lines at a time from inside the
// tiles of the current chunk. Blocks sit at scattered addresses, so the hardware prefetcher
// only helps within a block; and a burst of thousands of prefetches stalls the core until the
// misses drain, so it must be spread over the arithmetic for memory and compute to overlap.
struct PrefetchStream {
    static constexpr int kMaxRanges = 64;  // one per contiguous run of rows (<= rows per chunk)
    const char* begin[kMaxRanges];
    const char* end[kMaxRanges];
    int ranges = 0, cur = 0;
    const char* p = nullptr;
    int per_tile = 0;  // lines issued by each tile of row_dot / row_axpy

    void add(const void* row, int64_t bytes) {
        const char* b = static_cast<const char*>(row);
        if (ranges > 0 && end[ranges - 1] == b) {  // the next row of the same block
            end[ranges - 1] = b + bytes;
            return;
        }
        if (ranges == kMaxRanges) return;  // the rest is fetched on demand
        begin[ranges] = b;
        end[ranges] = b + bytes;
        if (ranges++ == 0) p = b;
    }
    int64_t lines() const {
        int64_t n = 0;
        for (int i = 0; i < ranges; ++i) n += (end[i] - begin[i] + 63) / 64;
        return n;
    }
    inline void issue(int n) {
        for (; n > 0 && cur < ranges; --n) {
            __builtin_prefetch(p, 0, 2);
            p += 64;
            if (p >= end[cur] && ++cur < ranges) p = begin[cur];
        }
    }
    inline void tile() { issue(per_tile); }
};

// Register tile shapes of one table's row_dot (query rows x cache rows) and row_axpy (output
// rows x columns); the callers read them to spread a PrefetchStream over the tiles.
struct TileShape {
    int64_t dot_rows, dot_keys, axpy_rows, axpy_cols;
};

struct IsaKernels {
    const char* name;
    int lanes;        // f32 values per vector register
    TileShape tiles;  // of row_dot / row_axpy
    // C[m, n] (+)= A[m, k] . B[k, n]; all f32, row-major with leading dimensions lda/ldb/ldc.
    void (*gemm)(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate);
    // The same product with B packed in 16-column panels: B[p, j] at bp[(j / 16) * b_ps + p * 16 + j % 16]
    // (columns of the last panel past n must hold finite values), and C[i, j] at
    // c[(j / 16) * c_ps + i * c_rs + j % 16] (row-major C: c_rs = ldc, c_ps = 16; only j < n is
    // written). Contiguous panels stream through L1: the power-of-two row strides of unpacked
    // weights and chunks (512 floats and more) map every row of a panel to one or two cache sets.
    void (*gemm_packed)(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* bp,
                        int64_t b_ps, float* c, int64_t c_rs, int64_t c_ps, bool accumulate);
    // gemm with B in bf16 (row-major, ldb): the attention's absorbed up-projections W_UK / W_UV
    // as a bf16 export stores them, read at half the bytes of an f32 copy (decode streams them
    // once per step and layer). Products and sums in f32.
    void (*gemm_bf16b)(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b,
                       int64_t ldb, float* c, int64_t ldc, bool accumulate);
    // dst[i] = float(src[i]) for src in f32/bf16/f16.
    void (*load_f32)(const void* src, DType dtype, float* dst, int64_t n);
    // x[i] *= scale for i < n; returns max_i x[i] (-inf when n == 0).
    float (*scale_max)(float* x, int64_t n, float scale);
    // x[i] = exp(x[i] - shift) for i < n; returns the sum. (x[i] = -inf gives 0.)
    float (*exp_sum)(float* x, int64_t n, float shift);
    // Scores against the f32 rows of a chunk: s[i * lds + j] = q[i * ldq + 0 .. w) . rows[j][0 .. w),
    // i < m, j < n. Each register tile advances pf (may be null) by its per_tile lines.
    void (*row_dot)(int64_t m, int64_t n, int64_t w, const float* q, int64_t ldq, const float* const* rows,
                    float* s, int64_t lds, PrefetchStream* pf);
    // Weighted sum of the rows: o[i * ldo + 0 .. width) += sum_j p[i * ldp + j] * rows[j][0 .. width).
    void (*row_axpy)(int64_t m, int64_t n, int64_t width, const float* p, int64_t ldp, const float* const* rows,
                     float* o, int64_t ldo, PrefetchStream* pf);
    // The chunk-level entry: n cache rows in their stored format (float rows, or quantised
    // codes with their group scales and bf16 k_pe; row_format.hpp) widened or dequantised in
    // registers into f32 dst[j * ldd + 0 .. W).
    void (*load_rows)(const RowFormat& fmt, const void* const* rows, int64_t n, float* dst, int64_t ldd);
};

// Register tiles that row_dot(m, n, ...) then row_axpy(m, ..., width, ...) run with table K
// (full tiles only: the edge tiles do not advance the prefetch stream).
inline int64_t dot_axpy_tiles(const IsaKernels& K, int64_t m, int64_t n, int64_t width) {
    const TileShape& t = K.tiles;
    return (m + t.dot_rows - 1) / t.dot_rows * (n / t.dot_keys) +
           (m + t.axpy_rows - 1) / t.axpy_rows * (width / t.axpy_cols);
}

const IsaKernels& isa_generic();    // always available
const IsaKernels* isa_avx2();       // nullptr when not compiled in
const IsaKernels* isa_avx512();     // nullptr when not compiled in

}  // namespace mla
