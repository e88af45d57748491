// Included by isa_<target>.cpp with MLA_ISA_NS defined: the same source compiled for several
// instruction sets. GCC/Clang vector extensions (8 x f32) map to one ymm register under AVX2
// and to two xmm registers in the baseline build.
#include <cmath>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "isa.hpp"
#include "numeric.hpp"

namespace mla {
namespace MLA_ISA_NS {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f loadu(const float* p) {
    v8f v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}
static inline void storeu(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }
static inline v8f splat(float x) { return v8f{x, x, x, x, x, x, x, x}; }

// 8 bf16 values widened to f32 (bf16 is the top half of an f32).
static inline v8f widen_bf16x8(const uint16_t* p) {
#if defined(__AVX2__)
    // One vpmovzxwd from memory + one shift (the generic form below compiles to five ops).
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return reinterpret_cast<v8f>(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
#else
    typedef uint16_t v8h __attribute__((vector_size(16)));
    typedef uint32_t v8u __attribute__((vector_size(32)));
    v8h h;
    std::memcpy(&h, p, sizeof(h));
    const v8u bits = __builtin_convertvector(h, v8u) << 16;
    v8f f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
#endif
}

// Register-blocked micro-kernel: MR rows of A times a 16-wide panel of B, accumulated in
// MR x 2 vector registers (12 of AVX2's 16 at MR = 6); B's panel row is loaded once per k and
// shared by all MR rows.
template <int MR>
static inline void micro16(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                           float* c, int64_t ldc, bool accumulate) {
    v8f acc[MR][2];
    for (int i = 0; i < MR; ++i) {
        if (accumulate) {
            acc[i][0] = loadu(c + i * ldc);
            acc[i][1] = loadu(c + i * ldc + 8);
        } else {
            acc[i][0] = splat(0.f);
            acc[i][1] = splat(0.f);
        }
    }
    for (int64_t p = 0; p < k; ++p) {
        const v8f b0 = loadu(b + p * ldb), b1 = loadu(b + p * ldb + 8);
        for (int i = 0; i < MR; ++i) {
            const v8f av = splat(a[i * lda + p]);
            acc[i][0] += av * b0;
            acc[i][1] += av * b1;
        }
    }
    for (int i = 0; i < MR; ++i) {
        storeu(c + i * ldc, acc[i][0]);
        storeu(c + i * ldc + 8, acc[i][1]);
    }
}

template <int MR>
static inline void micro8(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                          float* c, int64_t ldc, bool accumulate) {
    v8f acc[MR];
    for (int i = 0; i < MR; ++i) acc[i] = accumulate ? loadu(c + i * ldc) : splat(0.f);
    for (int64_t p = 0; p < k; ++p) {
        const v8f b0 = loadu(b + p * ldb);
        for (int i = 0; i < MR; ++i) acc[i] += splat(a[i * lda + p]) * b0;
    }
    for (int i = 0; i < MR; ++i) storeu(c + i * ldc, acc[i]);
}

typedef void (*MicroFn)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool);

static void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    static const MicroFn k16[7] = {nullptr, micro16<1>, micro16<2>, micro16<3>, micro16<4>, micro16<5>, micro16<6>};
    static const MicroFn k8[7] = {nullptr, micro8<1>, micro8<2>, micro8<3>, micro8<4>, micro8<5>, micro8<6>};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int64_t i = 0; i < m; i += 6) {
            const int64_t mr = m - i < 6 ? m - i : 6;
            k16[mr](k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate);
        }
    for (; j + 8 <= n; j += 8)
        for (int64_t i = 0; i < m; i += 6) {
            const int64_t mr = m - i < 6 ? m - i : 6;
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
    static const MicroFn k16[7] = {nullptr, micro16<1>, micro16<2>, micro16<3>, micro16<4>, micro16<5>, micro16<6>};
    for (int64_t j = 0; j < n; j += 16) {
        const float* b = bp + (j / 16) * b_ps;
        float* cp = c + (j / 16) * c_ps;
        const int64_t nr = n - j < 16 ? n - j : 16;
        for (int64_t i = 0; i < m; i += 6) {
            const int64_t mr = m - i < 6 ? m - i : 6;
            if (nr == 16) {
                k16[mr](k, a + i * lda, lda, b, 16, cp + i * c_rs, c_rs, accumulate);
                continue;
            }
            // Last, partial panel: through a full-width tile so nothing past column n is touched.
            float tile[6 * 16] = {};
            for (int64_t r = 0; r < mr && accumulate; ++r) std::memcpy(tile + r * 16, cp + (i + r) * c_rs, nr * 4);
            k16[mr](k, a + i * lda, lda, b, 16, tile, 16, accumulate);
            for (int64_t r = 0; r < mr; ++r) std::memcpy(cp + (i + r) * c_rs, tile + r * 16, nr * 4);
        }
    }
}

static void load_f32(const void* src, DType dtype, float* dst, int64_t n) {
    if (dtype == DType::bf16) {
        const auto* h = static_cast<const uint16_t*>(src);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) storeu(dst + i, widen_bf16x8(h + i));
        for (; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
        return;
    }
#if defined(__F16C__)
    if (dtype == DType::f16) {  // F16C: one vcvtph2ps per 8 values (the software path is ~10x slower)
        const auto* h = static_cast<const uint16_t*>(src);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
        for (; i < n; ++i) dst[i] = f16_to_f32(h[i]);
        return;
    }
#endif
    to_f32(src, dtype, dst, n);
}

// dst[i] = src[i] * scale: int8 codes of a quantised cache row (see cache_format.hpp).
static void dequant_i8(const int8_t* src, float scale, float* dst, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
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
// so with F16C it widens exactly by one shift and vcvtph2ps, and the 2^8 goes into the scale.
// (The NaN codes 0x7f/0xff read as +-480: the cache write never stores them; a row written
// from non-finite values has a NaN scale instead.)
static void dequant_e4m3(const uint8_t* src, float scale, float* dst, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
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

// exp(x) for x <= 0 (softmax after subtracting the max), as 2^(x log2 e) split into an integer
// power (built in the exponent bits) and a degree-6 polynomial on [-0.5, 0.5]; relative error
// ~2e-7. -inf and very negative inputs give 0.
static inline v8f exp_neg(v8f x) {
    const v8f lo = splat(-87.3f);
    x = x < lo ? lo : x;  // vector compare+select; keeps 2^n representable
    const v8f t = x * splat(1.44269504088896341f);
    // Round to nearest with the 1.5 * 2^23 trick (|t| < 2^22 here), branch-free and vectorised.
    const v8f n = (t + splat(12582912.0f)) - splat(12582912.0f);
    const v8f f = t - n;  // in [-0.5, 0.5]
    v8f p = splat(1.535336188319500e-4f);
    p = p * f + splat(1.339887440266574e-3f);
    p = p * f + splat(9.618437357674640e-3f);
    p = p * f + splat(5.550332471162809e-2f);
    p = p * f + splat(2.402264791363012e-1f);
    p = p * f + splat(6.931472028550421e-1f);
    p = p * f + splat(1.0f);
    const v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    v8f scale;
    std::memcpy(&scale, &e, sizeof(scale));
    const v8f r = p * scale;
    return x <= lo ? splat(0.f) : r;
}

static float scale_max(float* x, int64_t n, float scale) {
    const v8f sv = splat(scale);
    v8f mv = splat(-__builtin_inff());
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8f v = loadu(x + i) * sv;
        storeu(x + i, v);
        mv = v > mv ? v : mv;
    }
    float m = -__builtin_inff();
    for (int j = 0; j < 8; ++j) m = mv[j] > m ? mv[j] : m;
    for (; i < n; ++i) {
        x[i] *= scale;
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

static float exp_sum(float* x, int64_t n, float shift) {
    v8f acc = splat(0.f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8f e = exp_neg(loadu(x + i) - splat(shift));
        storeu(x + i, e);
        acc += e;
    }
    float s = 0.f;
    for (int j = 0; j < 8; ++j) s += acc[j];
    for (; i < n; ++i) {
        x[i] = std::exp(x[i] - shift);
        s += x[i];
    }
    return s;
}

static inline float hsum(v8f v) {
    float s = 0.f;
    for (int i = 0; i < 8; ++i) s += v[i];
    return s;
}

// out[i] = hsum(v[i]) for i < n (out has room for n rounded up to 4). Under AVX2 four vectors
// are reduced together by a horizontal-add tree (5 instructions for 4 sums instead of ~40
// scalar extracts and adds): the epilogue of a dot tile was ~10% of its time.
static inline void hsum_many(const v8f* v, int n, float* out) {
#if defined(__AVX2__)
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256 a = reinterpret_cast<__m256>(v[i]), b = reinterpret_cast<__m256>(v[i + 1]);
        const __m256 c = reinterpret_cast<__m256>(v[i + 2]), e = reinterpret_cast<__m256>(v[i + 3]);
        const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, e));
        _mm_storeu_ps(out + i, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
    }
    for (; i < n; ++i) out[i] = hsum(v[i]);
#else
    for (int i = 0; i < n; ++i) out[i] = hsum(v[i]);
#endif
}

// MH query rows x NK cache rows of dot products, MH * NK accumulators (12 of AVX2's 16 vector
// registers at 4 x 3): each loaded row vector serves MH query rows, each query vector NK rows.
template <int MH, int NK>
static inline void dot_tile(int64_t w, const float* q, int64_t ldq, const float* const* k, float* s, int64_t lds) {
    v8f acc[MH][NK];
    for (int i = 0; i < MH; ++i)
        for (int j = 0; j < NK; ++j) acc[i][j] = splat(0.f);
    int64_t d = 0;
    for (; d + 8 <= w; d += 8) {
        v8f kv[NK];
        for (int j = 0; j < NK; ++j) kv[j] = loadu(k[j] + d);
        for (int i = 0; i < MH; ++i) {
            const v8f qv = loadu(q + i * ldq + d);
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

template <int MH>
static void dot_rows_mh(int64_t n, int64_t w, const float* q, int64_t ldq, const float* const* k, float* s,
                        int64_t lds, PrefetchStream& pf) {
    int64_t j = 0;
    static_assert(kDotTileKeys == 3, "the tiles below are written for 3 cache rows");
    for (; j + 3 <= n; j += 3) {
        pf.tile();
        dot_tile<MH, 3>(w, q, ldq, k + j, s + j, lds);
    }
    if (n - j == 2) dot_tile<MH, 2>(w, q, ldq, k + j, s + j, lds);
    if (n - j == 1) dot_tile<MH, 1>(w, q, ldq, k + j, s + j, lds);
}

static void row_dot(int64_t m, int64_t n, int64_t w, const float* q, int64_t ldq, const float* const* rows,
                    float* s, int64_t lds, PrefetchStream* pf_in) {
    PrefetchStream none;
    PrefetchStream& pf = pf_in ? *pf_in : none;
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) dot_rows_mh<4>(n, w, q + i * ldq, ldq, rows, s + i * lds, lds, pf);
    switch (m - i) {
        case 3: dot_rows_mh<3>(n, w, q + i * ldq, ldq, rows, s + i * lds, lds, pf); break;
        case 2: dot_rows_mh<2>(n, w, q + i * ldq, ldq, rows, s + i * lds, lds, pf); break;
        case 1: dot_rows_mh<1>(n, w, q + i * ldq, ldq, rows, s + i * lds, lds, pf); break;
        default: break;
    }
}

// MH rows of o, 8 * NV columns, accumulated over n rows: the NV row vectors loaded per row j
// serve all MH rows of o (MH * NV accumulators).
template <int MH, int NV>
static inline void axpy_tile(int64_t n, const float* p, int64_t ldp, const float* const* v, int64_t c, float* o,
                             int64_t ldo) {
    v8f acc[MH][NV];
    for (int i = 0; i < MH; ++i)
        for (int u = 0; u < NV; ++u) acc[i][u] = loadu(o + i * ldo + c + 8 * u);
    for (int64_t j = 0; j < n; ++j) {
        v8f vv[NV];
        for (int u = 0; u < NV; ++u) vv[u] = loadu(v[j] + c + 8 * u);
        for (int i = 0; i < MH; ++i) {
            const v8f pb = splat(p[i * ldp + j]);
            for (int u = 0; u < NV; ++u) acc[i][u] += pb * vv[u];
        }
    }
    for (int i = 0; i < MH; ++i)
        for (int u = 0; u < NV; ++u) storeu(o + i * ldo + c + 8 * u, acc[i][u]);
}

// MH rows of o across the full width: tiles of NV vectors, then single vectors, then scalars.
template <int MH, int NV>
static void axpy_rows_mh(int64_t n, int64_t width, const float* p, int64_t ldp, const float* const* v, float* o,
                         int64_t ldo, PrefetchStream& pf) {
    int64_t c = 0;
    for (; c + 8 * NV <= width; c += 8 * NV) {
        pf.tile();
        axpy_tile<MH, NV>(n, p, ldp, v, c, o, ldo);
    }
    for (; c + 8 <= width; c += 8) axpy_tile<MH, 1>(n, p, ldp, v, c, o, ldo);
    for (; c < width; ++c)
        for (int i = 0; i < MH; ++i) {
            float t = o[i * ldo + c];
            for (int64_t j = 0; j < n; ++j) t += p[i * ldp + j] * v[j][c];
            o[i * ldo + c] = t;
        }
}

static void row_axpy(int64_t m, int64_t n, int64_t width, const float* p, int64_t ldp, const float* const* rows,
                     float* o, int64_t ldo, PrefetchStream* pf_in) {
    PrefetchStream none;
    PrefetchStream& pf = pf_in ? *pf_in : none;
    // 4 rows x 3 vectors: 12 accumulators, 3 row loads + 4 broadcasts per 12 FMAs (6 x 2 needed
    // 8, and H = 16 then ended in a 4 x 2 tile; in cache 73 -> 83 GFLOP/s at H = 16).
    static_assert(kAxpyTileRows == 4 && kAxpyTileCols == 24, "the tiles below are written for 4 x 24");
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) axpy_rows_mh<4, 3>(n, width, p + i * ldp, ldp, rows, o + i * ldo, ldo, pf);
    switch (m - i) {
        case 3: axpy_rows_mh<3, 4>(n, width, p + i * ldp, ldp, rows, o + i * ldo, ldo, pf); break;
        case 2: axpy_rows_mh<2, 4>(n, width, p + i * ldp, ldp, rows, o + i * ldo, ldo, pf); break;
        case 1: axpy_rows_mh<1, 4>(n, width, p + i * ldp, ldp, rows, o + i * ldo, ldo, pf); break;
        default: break;
    }
}

static const IsaKernels table = {MLA_ISA_NAME, gemm, gemm_packed, load_f32, scale_max, exp_sum, row_dot, row_axpy,
                                 dequant_i8, dequant_e4m3};

}  // namespace MLA_ISA_NS
}  // namespace mla
