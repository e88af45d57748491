// The integer-GEMM layer's vector kernels (see qgemm.hpp), written once with GCC/Clang vector
// extensions: a 16-lane float vector becomes one zmm with AVX-512, two ymm with AVX2 and four xmm
// on the baseline, so the same source serves every table. Included by one .cpp per instruction
// set, which defines MLA_QGEMM_NS and MLA_QGEMM_TABLE. The code only one ISA compiles sits in its
// own file (qgemm_avx512_dots.hpp, qgemm_avx2_dots.hpp, qgemm_vnni_q8.hpp, qgemm_avx2_q8.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "qgemm.hpp"
#if defined(__AVX512BF16__)
#include "fp8_bf16.hpp"
#endif

namespace mla {
namespace MLA_QGEMM_NS {
namespace {

typedef float vf __attribute__((vector_size(64)));
typedef uint8_t vb __attribute__((vector_size(16)));

inline vf loadf(const float* p) {
    vf v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline void storef(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vb loadb(const uint8_t* p) {
    vb v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
// u8 lanes -> float lanes. GCC 12 scalarises __builtin_convertvector from u8 (a movzbl and an
// insert per lane), so the x86 tables say it with intrinsics; the baseline table keeps a loop.
#if defined(__AVX512F__)
inline vf widen(vb b) {
    __m128i v;
    std::memcpy(&v, &b, sizeof v);
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
}
#elif defined(__AVX2__)
inline vf widen(vb b) {
    __m128i v;
    std::memcpy(&v, &b, sizeof v);
    union {
        __m256 h[2];
        vf f;
    } u;
    u.h[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    u.h[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
    return u.f;
}
#else
inline vf widen(vb b) {
    vf f;
    for (int i = 0; i < 16; ++i) f[i] = static_cast<float>(b[i]);
    return f;
}
#endif
// e4m3 codes -> their value / kE4m3ViaF16 in float lanes: the 7 bits below the sign become a
// float16's exponent and mantissa (exponent bias 7 against 15: the factor 2^8, the same for
// subnormal codes), then a float16 -> float32 conversion (F16C / AVX-512F). NaN codes never reach
// here (the export refuses non-finite weights).
#if defined(__AVX512F__)
inline vf widen_e4m3(vb b) {
    __m128i v;
    std::memcpy(&v, &b, sizeof v);
    const __m256i w = _mm256_cvtepu8_epi16(v);
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7));
    return (vf)_mm512_cvtph_ps(h);
}
#elif defined(__AVX2__)
inline __m256 e4m3x8(__m128i bytes8) {  // the low 8 bytes
    const __m128i w = _mm_cvtepu8_epi16(bytes8);
    return _mm256_cvtph_ps(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                                        _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7F)), 7)));
}
inline vf widen_e4m3(vb b) {
    __m128i v;
    std::memcpy(&v, &b, sizeof v);
    union {
        __m256 h[2];
        vf f;
    } u;
    u.h[0] = e4m3x8(v);
    u.h[1] = e4m3x8(_mm_srli_si128(v, 8));
    return u.f;
}
#else
inline float e4m3_value_over_256(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    const float mag = e == 0 ? static_cast<float>(m) * 0x1p-9f : (1.f + static_cast<float>(m) / 8.f) * std::ldexp(1.f, e - 7);
    return (c & 0x80 ? -mag : mag) / kE4m3ViaF16;
}
inline vf widen_e4m3(vb b) {
    static const struct Table {
        float v[256];
        Table() {
            for (int c = 0; c < 256; ++c) v[c] = e4m3_value_over_256(static_cast<uint8_t>(c));
        }
    } table;
    vf f;
    for (int i = 0; i < 16; ++i) f[i] = table.v[b[i]];
    return f;
}
#endif
inline float hsum(vf v) {
    float s = 0.f;
    for (int i = 0; i < 16; ++i) s += v[i];
    return s;
}
#if defined(__AVX2__)
// The 8 lanes of one ymm summed pairwise (the AVX2 tables' 8-lane kernels).
inline float hsum8(__m256 v) {
    alignas(32) float l[8];
    _mm256_store_ps(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
#endif

// Four rows by M tokens; the accumulators of one group are folded into the totals with the
// group's scale, and the zero points are taken out once per group through sum(x) over the group.
template <int BITS, int M>
void qdot(int64_t K, int64_t group, const float* const* x, const float* const* xsum, const QBlock& blk, float* out,
          int64_t ldo) {
    constexpr bool kFp8 = BITS == kFp8Bits;
    constexpr int64_t kChunk = BITS == 4 ? 32 : 16;  // inputs per 16-byte chunk
    vf tot[4][M];
    float corr[4][M];
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < M; ++t) tot[r][t] = vf{}, corr[r][t] = 0.f;
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
        vf acc[4][M];
        for (int r = 0; r < 4; ++r)
            for (int t = 0; t < M; ++t) acc[r][t] = vf{};
        const int64_t k0 = g * group, k1 = k0 + group;
        for (int64_t k = k0; k < k1; k += kChunk) {
            const uint8_t* chunk = blk.q + (k / kChunk) * 64;  // the 4 rows' 16 bytes, one cache line
            if (BITS != 4) {
                vf w[4];
                for (int r = 0; r < 4; ++r) w[r] = kFp8 ? widen_e4m3(loadb(chunk + 16 * r)) : widen(loadb(chunk + 16 * r));
                for (int t = 0; t < M; ++t) {
                    const vf xv = loadf(x[t] + k);
                    for (int r = 0; r < 4; ++r) acc[r][t] += w[r] * xv;
                }
            } else {
                vf lo[4], hi[4];
                for (int r = 0; r < 4; ++r) {
                    const vb b = loadb(chunk + 16 * r);
                    lo[r] = widen(b & 15);
                    hi[r] = widen(b >> 4);
                }
                for (int t = 0; t < M; ++t) {
                    const vf xl = loadf(x[t] + k), xh = loadf(x[t] + k + 16);
                    for (int r = 0; r < 4; ++r) acc[r][t] += lo[r] * xl + hi[r] * xh;
                }
            }
        }
        for (int r = 0; r < 4; ++r) {
            const float s = kFp8 ? blk.s[r][g] * kE4m3ViaF16 : blk.s[r][g];
            const float sz = kFp8 ? 0.f : s * static_cast<float>(blk.zp[r][g]);
            for (int t = 0; t < M; ++t) {
                tot[r][t] += acc[r][t] * s;
                corr[r][t] += sz * xsum[t][g];
            }
        }
    }
    for (int t = 0; t < M; ++t)
        for (int r = 0; r < 4; ++r) out[t * ldo + r] = hsum(tot[r][t]) - corr[r][t];
}

#if defined(__AVX512F__)
#include "qgemm_avx512_dots.hpp"
#else
template <int M>
void qdot4(int64_t K, int64_t group, const float* const* x, const float* const* xsum, const QBlock& blk, float* out,
           int64_t ldo) {
    qdot<4, M>(K, group, x, xsum, blk, out, ldo);
}
#endif

template <int BITS>
void dequant(int64_t n, const QBlock* blocks, int64_t k0, int64_t kb, int64_t group, float* dst) {
    constexpr int64_t kChunk = BITS == 4 ? 32 : 16;
    for (int64_t b = 0; b < n; ++b) {
        const QBlock& blk = blocks[b];
        for (int64_t p = 0; p < kb; p += 32) {
            const int64_t k = k0 + p, g = k / group;  // 32 | group: a 32-input step never straddles groups
            for (int r = 0; r < 4; ++r) {
                float* d = dst + (4 * b + r) * kb + p;
                if (BITS == kFp8Bits) {
                    const uint8_t* chunk = blk.q + (k / kChunk) * 64 + 16 * r;
                    const vf s8 = vf{} + blk.s[r][g] * kE4m3ViaF16;
                    storef(d, widen_e4m3(loadb(chunk)) * s8);
                    storef(d + 16, widen_e4m3(loadb(chunk + 64)) * s8);
                    continue;
                }
                const vf s = vf{} + blk.s[r][g], z = vf{} + static_cast<float>(blk.zp[r][g]);
                if (BITS == 8) {
                    const uint8_t* chunk = blk.q + (k / kChunk) * 64 + 16 * r;
                    storef(d, (widen(loadb(chunk)) - z) * s);
                    storef(d + 16, (widen(loadb(chunk + 64)) - z) * s);  // the next chunk of this row
                } else {
                    const vb q = loadb(blk.q + (k / kChunk) * 64 + 16 * r);
                    storef(d, (widen(q & 15) - z) * s);
                    storef(d + 16, (widen(q >> 4) - z) * s);
                }
            }
        }
    }
}

template <int M>
void fdot(int64_t k0, int64_t kb, const float* const* a, const float* w, float* out, int64_t ldo) {
    vf acc[4][M];
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < M; ++t) acc[r][t] = vf{};
    for (int64_t p = 0; p < kb; p += 16) {
        vf wv[4];
        for (int r = 0; r < 4; ++r) wv[r] = loadf(w + r * kb + p);
        for (int t = 0; t < M; ++t) {
            const vf av = loadf(a[t] + k0 + p);
            for (int r = 0; r < 4; ++r) acc[r][t] += wv[r] * av;
        }
    }
    for (int t = 0; t < M; ++t)
        for (int r = 0; r < 4; ++r) out[t * ldo + r] += hsum(acc[r][t]);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
#include "qgemm_avx2_dots.hpp"
#else
#ifndef MLA_QGEMM_QDOT_FP8
#define MLA_QGEMM_QDOT_FP8 {qdot<kFp8Bits, 1>, qdot<kFp8Bits, 2>, qdot<kFp8Bits, 3>, qdot<kFp8Bits, 4>}
#endif
#define MLA_QGEMM_QDOT {{qdot<8, 1>, qdot<8, 2>, qdot<8, 3>, qdot<8, 4>}, {qdot4<1>, qdot4<2>, qdot4<3>, qdot4<4>}, \
                      MLA_QGEMM_QDOT_FP8}
#define MLA_QGEMM_FDOT {fdot<1>, fdot<2>, fdot<3>, fdot<4>}
#endif

#if defined(__AVX512VNNI__)
#include "qgemm_vnni_q8.hpp"
#elif defined(__AVX2__)
#include "qgemm_avx2_q8.hpp"
#else
#define MLA_QGEMM_Q8_QUANTIZE quantize_row_q8
#endif
// The int8-dot entries: qdot_q8<BITS, NB, M> of the VNNI or the AVX2 kernel above; none elsewhere.
#if defined(__AVX512VNNI__) || defined(__AVX2__)
#define MLA_QGEMM_Q8                                                                                  \
    {{{qdot_q8<8, 1, 1>, qdot_q8<8, 1, 2>, qdot_q8<8, 1, 3>, qdot_q8<8, 1, 4>},                     \
      {qdot_q8<8, 2, 1>, qdot_q8<8, 2, 2>, qdot_q8<8, 2, 3>, qdot_q8<8, 2, 4>}},                    \
     {{qdot_q8<4, 1, 1>, qdot_q8<4, 1, 2>, qdot_q8<4, 1, 3>, qdot_q8<4, 1, 4>},                     \
      {qdot_q8<4, 2, 1>, qdot_q8<4, 2, 2>, qdot_q8<4, 2, 3>, qdot_q8<4, 2, 4>}}}
#else
#define MLA_QGEMM_Q8 {}
#endif
#ifndef MLA_QGEMM_Q8_LANES
#define MLA_QGEMM_Q8_LANES nullptr
#endif
#ifndef MLA_QGEMM_Q8_T16
#define MLA_QGEMM_Q8_T16 {}
#endif
#ifndef MLA_QGEMM_FP8_BF16
#define MLA_QGEMM_FP8_BF16 {}
#endif
#ifndef MLA_QGEMM_FP8_BF16_LUT
#define MLA_QGEMM_FP8_BF16_LUT {}
#endif
#ifndef MLA_QGEMM_FP8_LINES
#define MLA_QGEMM_FP8_LINES nullptr
#endif
#ifndef MLA_QGEMM_BF16_LINES
#define MLA_QGEMM_BF16_LINES {}
#endif
#ifndef MLA_QGEMM_FP8_T16
#define MLA_QGEMM_FP8_T16 {}
#endif


}  // namespace

extern const QgemmIsa MLA_QGEMM_TABLE;  // external linkage: kernel_config.cpp picks it
const QgemmIsa MLA_QGEMM_TABLE = {
    MLA_QGEMM_NAME,
    MLA_QGEMM_QDOT,
    {dequant<8>, dequant<4>, dequant<kFp8Bits>},
    MLA_QGEMM_FDOT,
    MLA_QGEMM_Q8,
    MLA_QGEMM_Q8_LANES,
    MLA_QGEMM_Q8_QUANTIZE,
    MLA_QGEMM_Q8_T16,
    MLA_QGEMM_FP8_BF16,
    MLA_QGEMM_FP8_BF16_LUT,
    MLA_QGEMM_FP8_LINES,
    MLA_QGEMM_BF16_LINES,
    MLA_QGEMM_FP8_T16,
};

}  // namespace MLA_QGEMM_NS
}  // namespace mla
