// Included by isa_<target>.cpp with these defined: the same source compiled for several
// instruction sets.
//   MLA_ISA_NS, MLA_ISA_NAME   namespace and name of the table
//   MLA_ISA_LANES              f32 lanes of the vector type vf (8: one ymm under AVX2, two xmm in
//                              the baseline; 16: one zmm under AVX-512)
//   MLA_ISA_DOT_ROWS/KEYS      row_dot's register tile (query rows x cache rows)
//   MLA_ISA_AXPY_ROWS/VECS     row_axpy's register tile (output rows x vectors of columns)
//   MLA_ISA_GEMM_MR            rows of gemm's micro-kernel
// Intrinsics are used only where the vector extensions compile badly (widening, conversions,
// horizontal sums), each under the macro of the instruction set it needs.
#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "isa.hpp"
#include "numeric.hpp"
#include "vec_exp.hpp"

namespace mla {
namespace MLA_ISA_NS {

constexpr int L = MLA_ISA_LANES;
static_assert(L == 8 || L == 16, "vf is 8 or 16 f32 lanes");
#if MLA_ISA_LANES == 16 && !defined(__AVX512F__)
#error "16 lanes need the AVX-512 build flags"
#endif
constexpr int kDotRows = MLA_ISA_DOT_ROWS, kDotKeys = MLA_ISA_DOT_KEYS;
constexpr int kAxpyRows = MLA_ISA_AXPY_ROWS, kAxpyVecs = MLA_ISA_AXPY_VECS;
constexpr int kGemmMR = MLA_ISA_GEMM_MR;

typedef float vf __attribute__((vector_size(4 * L)));
typedef int32_t vi __attribute__((vector_size(4 * L)));
typedef float v8f __attribute__((vector_size(32)));  // gemm's 8-column edge panels in every build

static inline vf loadu(const float* p) {
    vf v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}
static inline void storeu(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
static inline vf splat(float x) { return vf{} + x; }  // broadcast
static inline v8f loadu8(const float* p) {
    v8f v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}
static inline void storeu8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }
static inline v8f splat8(float x) { return v8f{x, x, x, x, x, x, x, x}; }

// L bf16 values widened to f32 (bf16 is the top half of an f32).
static inline vf widen_bf16(const uint16_t* p) {
#if MLA_ISA_LANES == 16
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return reinterpret_cast<vf>(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
#elif defined(__AVX2__)
    // One vpmovzxwd from memory + one shift (the generic form below compiles to five ops).
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return reinterpret_cast<vf>(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
#else
    typedef uint16_t vh __attribute__((vector_size(2 * L)));
    typedef uint32_t vu __attribute__((vector_size(4 * L)));
    vh h;
    std::memcpy(&h, p, sizeof(h));
    const vu bits = __builtin_convertvector(h, vu) << 16;
    vf f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
#endif
}

// One vector of B's row: f32 as it is, bf16 widened as it is loaded.
static inline vf load_b(const float* p) { return loadu(p); }
static inline vf load_b(const uint16_t* p) { return widen_bf16(p); }

// Register-blocked micro-kernel: MR rows of A times NV vectors of B's columns, accumulated in
// registers; B's row segment is loaded once per k and shared by all MR rows.
template <int MR, int NV, typename B>
static inline void micro_rows(int64_t k, const float* a, int64_t lda, const B* b, int64_t ldb, float* c,
                              int64_t ldc, bool accumulate) {
    vf acc[MR][NV];
    for (int i = 0; i < MR; ++i)
        for (int u = 0; u < NV; ++u) acc[i][u] = accumulate ? loadu(c + i * ldc + u * L) : splat(0.f);
    for (int64_t p = 0; p < k; ++p) {
        vf bv[NV];
        for (int u = 0; u < NV; ++u) bv[u] = load_b(b + p * ldb + u * L);
        for (int i = 0; i < MR; ++i) {
            const vf av = splat(a[i * lda + p]);
            for (int u = 0; u < NV; ++u) acc[i][u] += av * bv[u];
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int u = 0; u < NV; ++u) storeu(c + i * ldc + u * L, acc[i][u]);
}

// MR rows of A times a 16-wide panel of f32 B (16 / L vectors).
template <int MR>
static inline void micro16(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                           float* c, int64_t ldc, bool accumulate) {
    micro_rows<MR, 16 / L>(k, a, lda, b, ldb, c, ldc, accumulate);
}

template <int MR>
static inline void micro8(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                          float* c, int64_t ldc, bool accumulate) {
    v8f acc[MR];
    for (int i = 0; i < MR; ++i) acc[i] = accumulate ? loadu8(c + i * ldc) : splat8(0.f);
    for (int64_t p = 0; p < k; ++p) {
        const v8f b0 = loadu8(b + p * ldb);
        for (int i = 0; i < MR; ++i) acc[i] += splat8(a[i * lda + p]) * b0;
    }
    for (int i = 0; i < MR; ++i) storeu8(c + i * ldc, acc[i]);
}

typedef void (*MicroFn)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool);

// 16 lanes: a 16-column panel is one vector, so micro16 holds only MR accumulators and issues a
// broadcast per FMA. This one takes two 16-column panels at once (b and b + b_step; c and
// c + c_step: the next 16 columns of a row-major B, or the next packed panel), 2 MR accumulators
// sharing each broadcast, as AVX2's micro16 does with its two 8-lane halves.
template <int MR>
static inline void micro_pair(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t b_step,
                              float* c, int64_t ldc, int64_t c_step, bool accumulate) {
    vf acc[MR][2];
    for (int i = 0; i < MR; ++i)
        for (int u = 0; u < 2; ++u) acc[i][u] = accumulate ? loadu(c + u * c_step + i * ldc) : splat(0.f);
    for (int64_t p = 0; p < k; ++p) {
        const vf b0 = loadu(b + p * ldb), b1 = loadu(b + b_step + p * ldb);
        for (int i = 0; i < MR; ++i) {
            const vf av = splat(a[i * lda + p]);
            acc[i][0] += av * b0;
            acc[i][1] += av * b1;
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int u = 0; u < 2; ++u) storeu(c + u * c_step + i * ldc, acc[i][u]);
}
typedef void (*PairFn)(int64_t, const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, int64_t, bool);
static const PairFn* pair_table() {
    static const PairFn table[] = {nullptr, micro_pair<1>, micro_pair<2>, micro_pair<3>, micro_pair<4>,
                                   micro_pair<5>, micro_pair<6>, micro_pair<7>, micro_pair<8>};
    return table;
}
constexpr bool kPairs = L == 16 && kGemmMR <= 8;

// The micro-kernels for 1 .. kGemmMR rows, indexed by the row count.
template <int MR>
struct Micro16 {
    static constexpr MicroFn fn = micro16<MR>;
};
template <int MR>
struct Micro8 {
    static constexpr MicroFn fn = micro8<MR>;
};
template <template <int> class Pick>
static const MicroFn* micro_table() {
    static const MicroFn table[] = {
#if MLA_ISA_GEMM_MR == 6
        nullptr, Pick<1>::fn, Pick<2>::fn, Pick<3>::fn, Pick<4>::fn, Pick<5>::fn, Pick<6>::fn
#elif MLA_ISA_GEMM_MR == 8
        nullptr, Pick<1>::fn, Pick<2>::fn, Pick<3>::fn, Pick<4>::fn, Pick<5>::fn, Pick<6>::fn, Pick<7>::fn,
        Pick<8>::fn
#else
#error "MLA_ISA_GEMM_MR must be 6 or 8"
#endif
    };
    return table;
}

static void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    const MicroFn* k16 = micro_table<Micro16>();
    const MicroFn* k8 = micro_table<Micro8>();
    int64_t j = 0;
    if (kPairs)
        for (; j + 32 <= n; j += 32)
            for (int64_t i = 0; i < m; i += kGemmMR) {
                const int64_t mr = m - i < kGemmMR ? m - i : kGemmMR;
                pair_table()[mr](k, a + i * lda, lda, b + j, ldb, 16, c + i * ldc + j, ldc, 16, accumulate);
            }
    for (; j + 16 <= n; j += 16)
        for (int64_t i = 0; i < m; i += kGemmMR) {
            const int64_t mr = m - i < kGemmMR ? m - i : kGemmMR;
            k16[mr](k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate);
        }
    for (; j + 8 <= n; j += 8)
        for (int64_t i = 0; i < m; i += kGemmMR) {
            const int64_t mr = m - i < kGemmMR ? m - i : kGemmMR;
            k8[mr](k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate);
        }
    // Columns past the last multiple of 8 (small head dims, odd block sizes): plain loops.
    for (; j < n; ++j)
        for (int64_t i = 0; i < m; ++i) {
            float s = accumulate ? c[i * ldc + j] : 0.f;
            for (int64_t p = 0; p < k; ++p) s += a[i * lda + p] * b[p * ldb + j];
            c[i * ldc + j] = s;
        }
}

static void gemm_packed(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* bp,
                        int64_t b_ps, float* c, int64_t c_rs, int64_t c_ps, bool accumulate) {
    const MicroFn* k16 = micro_table<Micro16>();
    int64_t j0 = 0;
    if (kPairs)
        for (; j0 + 32 <= n; j0 += 32)  // two full panels at a time
            for (int64_t i = 0; i < m; i += kGemmMR) {
                const int64_t mr = m - i < kGemmMR ? m - i : kGemmMR;
                pair_table()[mr](k, a + i * lda, lda, bp + (j0 / 16) * b_ps, 16, b_ps,
                                 c + (j0 / 16) * c_ps + i * c_rs, c_rs, c_ps, accumulate);
            }
    for (int64_t j = j0; j < n; j += 16) {
        const float* b = bp + (j / 16) * b_ps;
        float* cp = c + (j / 16) * c_ps;
        const int64_t nr = n - j < 16 ? n - j : 16;
        for (int64_t i = 0; i < m; i += kGemmMR) {
            const int64_t mr = m - i < kGemmMR ? m - i : kGemmMR;
            if (nr == 16) {
                k16[mr](k, a + i * lda, lda, b, 16, cp + i * c_rs, c_rs, accumulate);
                continue;
            }
            // Last, partial panel: through a full-width tile so nothing past column n is touched.
            float tile[kGemmMR * 16] = {};
            for (int64_t r = 0; r < mr && accumulate; ++r) std::memcpy(tile + r * 16, cp + (i + r) * c_rs, nr * 4);
            k16[mr](k, a + i * lda, lda, b, 16, tile, 16, accumulate);
            for (int64_t r = 0; r < mr; ++r) std::memcpy(cp + (i + r) * c_rs, tile + r * 16, nr * 4);
        }
    }
}

// f16 -> f32 of L values (F16C: one vcvtph2ps; the software path is ~10x slower).
#if defined(__F16C__) || MLA_ISA_LANES == 16
#define MLA_ISA_HAVE_F16_VEC 1
static inline vf widen_f16(const uint16_t* p) {
#if MLA_ISA_LANES == 16
    return reinterpret_cast<vf>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#else
    return reinterpret_cast<vf>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#endif
}
#endif

static void load_f32(const void* src, DType dtype, float* dst, int64_t n) {
    if (dtype == DType::bf16) {
        const auto* h = static_cast<const uint16_t*>(src);
        int64_t i = 0;
        for (; i + L <= n; i += L) storeu(dst + i, widen_bf16(h + i));
        for (; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
        return;
    }
#if defined(MLA_ISA_HAVE_F16_VEC)
    if (dtype == DType::f16) {
        const auto* h = static_cast<const uint16_t*>(src);
        int64_t i = 0;
        for (; i + L <= n; i += L) storeu(dst + i, widen_f16(h + i));
        for (; i < n; ++i) dst[i] = f16_to_f32(h[i]);
        return;
    }
#endif
    to_f32(src, dtype, dst, n);
}

// dst[i] = src[i] * scale: int8 codes of a quantised cache row (see cache_format.hpp).
static void dequant_i8(const int8_t* src, float scale, float* dst, int64_t n) {
    int64_t i = 0;
#if MLA_ISA_LANES == 16
    const __m512 sv = _mm512_set1_ps(scale);
    for (; i + 16 <= n; i += 16) {
        const __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(w), sv));
    }
#elif defined(__AVX2__)
    const __m256 sv = _mm256_set1_ps(scale);
    for (; i + 16 <= n; i += 16) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(lo, sv));
        _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(hi, sv));
    }
#endif
    for (; i < n; ++i) dst[i] = static_cast<float>(src[i]) * scale;
}

// dst[i] = e4m3fn(src[i]) * scale. An e4m3fn byte S.EEEE.MMM moved to bits 15 and 13..7 of a
// half is the same number times 2^-8 (exponent bias 15 instead of 7; subnormals line up too),
// so it widens exactly by one shift and a half -> f32 conversion, and the 2^8 goes into the
// scale. (The NaN codes 0x7f/0xff read as +-480: the cache write never stores them; a row
// written from non-finite values has a NaN scale instead.)
static void dequant_e4m3(const uint8_t* src, float scale, float* dst, int64_t n) {
    int64_t i = 0;
#if MLA_ISA_LANES == 16
    const __m512 sv = _mm512_set1_ps(scale * 256.0f);
    const __m512i keep = _mm512_set1_epi16(static_cast<short>(0xbf80));
    for (; i + 32 <= n; i += 32) {
        const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
        const __m512i h = _mm512_and_si512(_mm512_slli_epi16(w, 7), keep);
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), sv));
        _mm512_storeu_ps(dst + i + 16, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), sv));
    }
#elif defined(__F16C__) && defined(__AVX2__)
    const __m256 sv = _mm256_set1_ps(scale * 256.0f);
    // Sign-extended to 16 bits and shifted left by 7, bit 15 is the sign, bits 13..7 the
    // magnitude, and bit 14 a copy of the sign, which the mask clears.
    const __m256i keep = _mm256_set1_epi16(static_cast<short>(0xbf80));
    for (; i + 16 <= n; i += 16) {
        const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
        const __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), keep);
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), sv));
        _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), sv));
    }
#endif
    for (; i < n; ++i) dst[i] = e4m3_to_f32(src[i]) * scale;
}

// dst[i] = e5m2(src[i]) * scale: an e5m2 byte is the top byte of an IEEE half, so it widens
// exactly by a shift into the high byte and a half -> f32 conversion. (Codes 0x7c..0x7f and
// 0xfc..0xff, inf and NaN, are never written: values are scaled to at most 57344.)
static void dequant_e5m2(const uint8_t* src, float scale, float* dst, int64_t n) {
    int64_t i = 0;
#if MLA_ISA_LANES == 16
    const __m512 sv = _mm512_set1_ps(scale);
    for (; i + 32 <= n; i += 32) {
        const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
        const __m512i h = _mm512_slli_epi16(w, 8);
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), sv));
        _mm512_storeu_ps(dst + i + 16, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), sv));
    }
#elif defined(__F16C__) && defined(__AVX2__)
    const __m256 sv = _mm256_set1_ps(scale);
    for (; i + 16 <= n; i += 16) {
        const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
        const __m256i h = _mm256_slli_epi16(w, 8);
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), sv));
        _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), sv));
    }
#endif
    for (; i < n; ++i) dst[i] = f16_to_f32(static_cast<uint16_t>(src[i] << 8)) * scale;
}

// One group of n codes -> code * scale: the widenings above for the code types that have one,
// any other code type (cache_formats.hpp) by its scalar decode.
template <class Code>
static void dequant(Code, const void* src, float scale, float* dst, int64_t n) {
    const auto* s = static_cast<const typename Code::Storage*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = Code::decode(s[i]) * scale;
}
static void dequant(Int8Code, const void* src, float scale, float* dst, int64_t n) {
    dequant_i8(static_cast<const int8_t*>(src), scale, dst, n);
}
static void dequant(E4m3Code, const void* src, float scale, float* dst, int64_t n) {
    dequant_e4m3(static_cast<const uint8_t*>(src), scale, dst, n);
}
static void dequant(E5m2Code, const void* src, float scale, float* dst, int64_t n) {
    dequant_e5m2(static_cast<const uint8_t*>(src), scale, dst, n);
}

// load_rows for the rows of one format F (cache_formats.hpp's traits).
template <class F>
static void load_rows_of(const RowFormat& f, const void* const* rows, int64_t n, float* dst, int64_t ldd) {
    for (int64_t j = 0; j < n; ++j) {
        const auto* p = static_cast<const char*>(rows[j]);
        float* d = dst + j * ldd;
        if constexpr (F::groups == 0) {
            if constexpr (F::elem == DType::f32)
                std::memcpy(d, p, static_cast<size_t>(f.width) * 4);
            else
                load_f32(p, F::elem, d, f.width);
        } else {  // codes by group, the group scales, bf16 k_pe
            const int64_t gs = f.group_size();
            for (int64_t g = 0; g < F::groups; ++g) {
                float scale;
                std::memcpy(&scale, p + f.scale_offset() + 4 * g, 4);
                dequant(typename F::Code{}, p + g * gs, scale, d + g * gs, gs);
            }
            load_f32(p + f.kpe_offset(), DType::bf16, d + f.rank, f.width - f.rank);
        }
    }
}

// The chunk-level entry (isa.hpp): rows in their stored format -> f32 rows; the format is
// resolved once per call, not per row.
static void load_rows(const RowFormat& f, const void* const* rows, int64_t n, float* dst, int64_t ldd) {
    with_format(f.kind, [&](auto fmt) { load_rows_of<decltype(fmt)>(f, rows, n, dst, ldd); });
}

// exp(x) for x <= 0 (softmax after subtracting the max): vec_exp.hpp.
static inline vf exp_neg(vf x) { return exp_neg_lanes<vf, vi>(x); }

static float scale_max(float* x, int64_t n, float scale) {
    const vf sv = splat(scale);
    vf mv = splat(-__builtin_inff());
    int64_t i = 0;
    for (; i + L <= n; i += L) {
        const vf v = loadu(x + i) * sv;
        storeu(x + i, v);
        mv = v > mv ? v : mv;
    }
    float m = -__builtin_inff();
    for (int j = 0; j < L; ++j) m = mv[j] > m ? mv[j] : m;
    for (; i < n; ++i) {
        x[i] *= scale;
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

static float exp_sum(float* x, int64_t n, float shift) {
    vf acc = splat(0.f);
    int64_t i = 0;
    for (; i + L <= n; i += L) {
        const vf e = exp_neg(loadu(x + i) - splat(shift));
        storeu(x + i, e);
        acc += e;
    }
    float s = 0.f;
    for (int j = 0; j < L; ++j) s += acc[j];
    for (; i < n; ++i) {
        x[i] = std::exp(x[i] - shift);
        s += x[i];
    }
    return s;
}

static inline float hsum(vf v) {
    float s = 0.f;
    for (int i = 0; i < L; ++i) s += v[i];
    return s;
}

// out[i] = hsum(v[i]) for i < n (out has room for n rounded up to 4). With AVX2 four vectors
// are reduced together by a horizontal-add tree (5 instructions for 4 sums instead of ~40
// scalar extracts and adds): the epilogue of a dot tile was ~10% of its time. 16-lane vectors
// are first folded to 8 lanes.
static inline void hsum_many(const vf* v, int n, float* out) {
#if defined(__AVX2__)
    auto half = [](vf x) {
#if MLA_ISA_LANES == 16
        const __m512 z = reinterpret_cast<__m512>(x);
        return _mm256_add_ps(_mm512_castps512_ps256(z), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1)));
#else
        return reinterpret_cast<__m256>(x);
#endif
    };
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256 a = half(v[i]), b = half(v[i + 1]), c = half(v[i + 2]), e = half(v[i + 3]);
        const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, e));
        _mm_storeu_ps(out + i, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
    }
    for (; i < n; ++i) out[i] = hsum(v[i]);
#else
    for (int i = 0; i < n; ++i) out[i] = hsum(v[i]);
#endif
}

// MH query rows x NK cache rows of dot products, MH * NK accumulators: each loaded row vector
// serves MH query rows, each query vector NK rows.
template <int MH, int NK>
static inline void dot_tile(int64_t w, const float* q, int64_t ldq, const float* const* k, float* s, int64_t lds) {
    vf acc[MH][NK];
    for (int i = 0; i < MH; ++i)
        for (int j = 0; j < NK; ++j) acc[i][j] = splat(0.f);
    int64_t d = 0;
    for (; d + L <= w; d += L) {
        vf kv[NK];
        for (int j = 0; j < NK; ++j) kv[j] = loadu(k[j] + d);
        for (int i = 0; i < MH; ++i) {
            const vf qv = loadu(q + i * ldq + d);
            for (int j = 0; j < NK; ++j) acc[i][j] += qv * kv[j];
        }
    }
    float sums[MH * NK + 3];
    hsum_many(&acc[0][0], MH * NK, sums);
    for (int i = 0; i < MH; ++i)
        for (int j = 0; j < NK; ++j) {
            float t = sums[i * NK + j];
            for (int64_t e = d; e < w; ++e) t += q[i * ldq + e] * k[j][e];
            s[i * lds + j] = t;
        }
}

// The last n < NK cache rows: dot_tile<MH, n>.
template <int MH, int NK>
static inline void dot_tail(int64_t n, int64_t w, const float* q, int64_t ldq, const float* const* k, float* s,
                            int64_t lds) {
    if constexpr (NK > 0) {
        if (n == NK) return dot_tile<MH, NK>(w, q, ldq, k, s, lds);
        dot_tail<MH, NK - 1>(n, w, q, ldq, k, s, lds);
    }
}

template <int MH>
static void dot_rows_mh(int64_t n, int64_t w, const float* q, int64_t ldq, const float* const* k, float* s,
                        int64_t lds, PrefetchStream& pf) {
    int64_t j = 0;
    for (; j + kDotKeys <= n; j += kDotKeys) {
        pf.tile();
        dot_tile<MH, kDotKeys>(w, q, ldq, k + j, s + j, lds);
    }
    dot_tail<MH, kDotKeys - 1>(n - j, w, q, ldq, k + j, s + j, lds);
}

// The last m < kDotRows query rows: dot_rows_mh<m>.
template <int MH>
static inline void dot_rows_tail(int64_t m, int64_t n, int64_t w, const float* q, int64_t ldq,
                                 const float* const* k, float* s, int64_t lds, PrefetchStream& pf) {
    if constexpr (MH > 0) {
        if (m == MH) return dot_rows_mh<MH>(n, w, q, ldq, k, s, lds, pf);
        dot_rows_tail<MH - 1>(m, n, w, q, ldq, k, s, lds, pf);
    }
}

static void row_dot(int64_t m, int64_t n, int64_t w, const float* q, int64_t ldq, const float* const* rows,
                    float* s, int64_t lds, PrefetchStream* pf_in) {
    PrefetchStream none;
    PrefetchStream& pf = pf_in ? *pf_in : none;
    int64_t i = 0;
    for (; i + kDotRows <= m; i += kDotRows) dot_rows_mh<kDotRows>(n, w, q + i * ldq, ldq, rows, s + i * lds, lds, pf);
    dot_rows_tail<kDotRows - 1>(m - i, n, w, q + i * ldq, ldq, rows, s + i * lds, lds, pf);
}

// MH rows of o, L * NV columns, accumulated over n rows: the NV row vectors loaded per row j
// serve all MH rows of o (MH * NV accumulators).
template <int MH, int NV>
static inline void axpy_tile(int64_t n, const float* p, int64_t ldp, const float* const* v, int64_t c, float* o,
                             int64_t ldo) {
    vf acc[MH][NV];
    for (int i = 0; i < MH; ++i)
        for (int u = 0; u < NV; ++u) acc[i][u] = loadu(o + i * ldo + c + L * u);
    for (int64_t j = 0; j < n; ++j) {
        vf vv[NV];
        for (int u = 0; u < NV; ++u) vv[u] = loadu(v[j] + c + L * u);
        for (int i = 0; i < MH; ++i) {
            const vf pb = splat(p[i * ldp + j]);
            for (int u = 0; u < NV; ++u) acc[i][u] += pb * vv[u];
        }
    }
    for (int i = 0; i < MH; ++i)
        for (int u = 0; u < NV; ++u) storeu(o + i * ldo + c + L * u, acc[i][u]);
}

// MH rows of o across the full width: tiles of NV vectors, then single vectors, then scalars.
template <int MH, int NV>
static void axpy_rows_mh(int64_t n, int64_t width, const float* p, int64_t ldp, const float* const* v, float* o,
                         int64_t ldo, PrefetchStream& pf) {
    int64_t c = 0;
    for (; c + L * NV <= width; c += L * NV) {
        pf.tile();
        axpy_tile<MH, NV>(n, p, ldp, v, c, o, ldo);
    }
    for (; c + L <= width; c += L) axpy_tile<MH, 1>(n, p, ldp, v, c, o, ldo);
    for (; c < width; ++c)
        for (int i = 0; i < MH; ++i) {
            float t = o[i * ldo + c];
            for (int64_t j = 0; j < n; ++j) t += p[i * ldp + j] * v[j][c];
            o[i * ldo + c] = t;
        }
}

// The last m < kAxpyRows output rows (fewer rows leave registers for one more vector).
template <int MH>
static inline void axpy_rows_tail(int64_t m, int64_t n, int64_t width, const float* p, int64_t ldp,
                                  const float* const* v, float* o, int64_t ldo, PrefetchStream& pf) {
    if constexpr (MH > 0) {
        if (m == MH) return axpy_rows_mh<MH, kAxpyVecs + 1>(n, width, p, ldp, v, o, ldo, pf);
        axpy_rows_tail<MH - 1>(m, n, width, p, ldp, v, o, ldo, pf);
    }
}

static void row_axpy(int64_t m, int64_t n, int64_t width, const float* p, int64_t ldp, const float* const* rows,
                     float* o, int64_t ldo, PrefetchStream* pf_in) {
    PrefetchStream none;
    PrefetchStream& pf = pf_in ? *pf_in : none;
    int64_t i = 0;
    for (; i + kAxpyRows <= m; i += kAxpyRows)
        axpy_rows_mh<kAxpyRows, kAxpyVecs>(n, width, p + i * ldp, ldp, rows, o + i * ldo, ldo, pf);
    axpy_rows_tail<kAxpyRows - 1>(m - i, n, width, p + i * ldp, ldp, rows, o + i * ldo, ldo, pf);
}

// MR rows of C against bf16 B across all n columns: tiles of 4 vectors (each B row segment widened
// once and shared by the MR rows), then single vectors, then scalars.
template <int MR>
static void bf16b_rows(int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b, int64_t ldb, float* c,
                       int64_t ldc, bool accumulate) {
    constexpr int V = 4;
    int64_t j = 0;
    for (; j + V * L <= n; j += V * L) micro_rows<MR, V>(k, a, lda, b + j, ldb, c + j, ldc, accumulate);
    for (; j + L <= n; j += L) micro_rows<MR, 1>(k, a, lda, b + j, ldb, c + j, ldc, accumulate);
    for (; j < n; ++j)
        for (int i = 0; i < MR; ++i) {
            float s = accumulate ? c[i * ldc + j] : 0.f;
            for (int64_t p = 0; p < k; ++p) s += a[i * lda + p] * bf16_to_f32(b[p * ldb + j]);
            c[i * ldc + j] = s;
        }
}

// MR (< kBf16Rows) rows of C against bf16 B walked row by row, each B row read once, whole and in
// order, its products added into C's rows (in L1: n floats a row). Fewer rows than a register
// tile's are a decode step's (one token a sequence): B comes from memory there, and the column
// panels of bf16b_rows walk it in strips (4 vectors of every row, then the next 4). Zen 4, 2
// threads, 16 heads' W_UK and W_UV of 16 layers in turn, one row: the strips 13-22 GB/s, this walk
// 21-32 GB/s (alternated, a scratch copy of both); tools/kernels/up_stream.cpp measures this one
// against a plain read (0.62-0.70 of it). The attention op alone, its weights cold, 16 heads, 1
// token: 0.43 -> 0.32 ms at 2 cached rows.
template <int MR>
static void bf16b_row_walk(int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b, int64_t ldb,
                           float* c, int64_t ldc, bool accumulate) {
    for (int i = 0; i < MR; ++i)
        if (!accumulate) std::fill(c + i * ldc, c + i * ldc + n, 0.f);
    for (int64_t p = 0; p < k; ++p) {
        const uint16_t* row = b + p * ldb;
        vf av[MR];
        for (int i = 0; i < MR; ++i) av[i] = splat(a[i * lda + p]);
        int64_t j = 0;
        for (; j + L <= n; j += L) {
            const vf bv = load_b(row + j);
            for (int i = 0; i < MR; ++i) storeu(c + i * ldc + j, loadu(c + i * ldc + j) + av[i] * bv);
        }
        for (; j < n; ++j)
            for (int i = 0; i < MR; ++i) c[i * ldc + j] += a[i * lda + p] * bf16_to_f32(row[j]);
    }
}

// One row of A against bf16 B in column panels of NV vectors held in registers down all k rows of
// B (bf16b_walk1).
template <int NV>
static inline int64_t bf16b_panels1(int64_t j, int64_t n, int64_t k, const float* a, const uint16_t* b,
                                    int64_t ldb, float* c, bool accumulate) {
    for (; j + NV * L <= n; j += NV * L) {
        vf acc[NV];
        for (int v = 0; v < NV; ++v) acc[v] = accumulate ? loadu(c + j + v * L) : vf{};
        for (int64_t p = 0; p < k; ++p) {
            const vf av = splat(a[p]);
            const uint16_t* row = b + p * ldb + j;
#pragma GCC unroll 16
            for (int v = 0; v < NV; ++v) acc[v] += av * load_b(row + v * L);
        }
        for (int v = 0; v < NV; ++v) storeu(c + j + v * L, acc[v]);
    }
    return j;
}

// A decode token's row against bf16 B on AVX-512: the walk of bf16b_row_walk<1> (B's rows in
// order, the same sums in the same order), with C's columns in registers, 256 at a time (W_UK's
// 512 in two passes over its rows, W_UV's 128 in one), instead of loading and storing C's row for
// every row of B. The up-projections alone (tools/kernels/up_stream.cpp's shapes, Zen 4, 2 threads,
// in one process against a register-panel copy): the row walk took 1.10-1.30x the copy's time,
// this 0.98-1.02x (docs/KERNELS.md, "Streaming the weights at read speed").
static void bf16b_walk1(int64_t n, int64_t k, const float* a, const uint16_t* b, int64_t ldb, float* c,
                        bool accumulate) {
    int64_t j = bf16b_panels1<16>(0, n, k, a, b, ldb, c, accumulate);
    j = bf16b_panels1<8>(j, n, k, a, b, ldb, c, accumulate);
    j = bf16b_panels1<4>(j, n, k, a, b, ldb, c, accumulate);
    j = bf16b_panels1<1>(j, n, k, a, b, ldb, c, accumulate);
    for (; j < n; ++j) {
        float s = accumulate ? c[j] : 0.f;
        for (int64_t p = 0; p < k; ++p) s += a[p] * bf16_to_f32(b[p * ldb + j]);
        c[j] = s;
    }
}

// C[m, n] (+)= A[m, k] . B[k, n] with B bf16 (the absorbed form's W_UK / W_UV as a bf16 export
// stores them): rows of A in blocks of kBf16Rows, so one pass over B serves that many rows (a
// decode batch's rows of one head share its weights); fewer rows walk B in order (bf16b_row_walk).
constexpr int kBf16Rows = L == 16 ? 4 : 2;  // x 4 vectors of accumulators + 4 of B in the registers
static void gemm_bf16b(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b,
                       int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    switch (m < kBf16Rows ? m : 0) {
        case 1:
            if (L == 16) return bf16b_walk1(n, k, a, b, ldb, c, accumulate);
            return bf16b_row_walk<1>(n, k, a, lda, b, ldb, c, ldc, accumulate);
        case 2: return bf16b_row_walk<2>(n, k, a, lda, b, ldb, c, ldc, accumulate);
        case 3: return bf16b_row_walk<3>(n, k, a, lda, b, ldb, c, ldc, accumulate);
        default: break;
    }
    int64_t i = 0;
    for (; i + kBf16Rows <= m; i += kBf16Rows)
        bf16b_rows<kBf16Rows>(n, k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
    for (; i < m; ++i) bf16b_rows<1>(n, k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
}

static const IsaKernels table = {MLA_ISA_NAME,
                                 L,
                                 TileShape{kDotRows, kDotKeys, kAxpyRows, int64_t(L) * kAxpyVecs},
                                 gemm,
                                 gemm_packed,
                                 gemm_bf16b,
                                 load_f32,
                                 scale_max,
                                 exp_sum,
                                 row_dot,
                                 row_axpy,
                                 load_rows};

}  // namespace MLA_ISA_NS
}  // namespace mla
