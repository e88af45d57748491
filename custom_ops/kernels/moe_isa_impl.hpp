// The fused MoE op's vector kernels (see moe_isa.hpp), written once with GCC/Clang vector
// extensions: a 16-lane float vector becomes one zmm with AVX-512, two ymm with AVX2 and four xmm
// on the baseline, so the same source serves every table. Included by one .cpp per instruction
// set, which defines MLA_MOE_NS and MLA_MOE_TABLE.
#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "moe_isa.hpp"
#if defined(__AVX512BF16__)
#include "fp8_bf16.hpp"
#endif

namespace mla {
namespace MLA_MOE_NS {
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
// int4 with AVX-512: a 16-entry table per row and group holds the 16 dequantised values
// (c - zp) * s, and vpermps looks each code up (its index is the low 4 bits of each dword, so the
// zero-extended byte indexes the low nibble as it is and the byte shifted by 4 the high one).
// One lookup replaces the mask, the int -> float conversion and the scale; no zero-point term.
template <int M>
void qdot4_lut(int64_t K, int64_t group, const float* const* x, const QBlock& blk, float* out, int64_t ldo) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 acc[4][M];
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < M; ++t) acc[r][t] = _mm512_setzero_ps();
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
        __m512 lut[4];
        for (int r = 0; r < 4; ++r)
            lut[r] = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(static_cast<float>(blk.zp[r][g]))),
                                   _mm512_set1_ps(blk.s[r][g]));
        const int64_t k0 = g * group, k1 = k0 + group;
        for (int64_t k = k0; k < k1; k += 32) {
            const uint8_t* chunk = blk.q + (k / 32) * 64;
            __m512 lo[4], hi[4];
            for (int r = 0; r < 4; ++r) {
                const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 16 * r)));
                lo[r] = _mm512_permutexvar_ps(b, lut[r]);
                hi[r] = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut[r]);
            }
            for (int t = 0; t < M; ++t) {
                const __m512 xl = _mm512_loadu_ps(x[t] + k), xh = _mm512_loadu_ps(x[t] + k + 16);
                for (int r = 0; r < 4; ++r) acc[r][t] = _mm512_fmadd_ps(hi[r], xh, _mm512_fmadd_ps(lo[r], xl, acc[r][t]));
            }
        }
    }
    for (int t = 0; t < M; ++t)
        for (int r = 0; r < 4; ++r) out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int M>
void qdot4(int64_t K, int64_t group, const float* const* x, const float* const*, const QBlock& blk, float* out,
           int64_t ldo) {
    qdot4_lut<M>(K, group, x, blk, out, ldo);
}

// fp8 (e4m3) codes with AVX-512: each row's 16 codes of a chunk widened through float16
// (widen_e4m3's bit moves on 16-bit lanes, then vcvtph2ps), M tokens' FMAs on them, each group's
// sums folded in with its scale x 2^8. Decode streams the codes: 1-2 tokens prefetch 2 KB ahead on
// Intel cores (as the int8 dots, qdot_q8), which the hardware prefetcher alone does not keep up with.
template <int M>
void qdot_fp8(int64_t K, int64_t group, const float* const* x, const float* const*, const QBlock& blk, float* out,
              int64_t ldo) {
    static const bool intel = __builtin_cpu_is("intel");
    const bool prefetch = intel && M <= 2;
    const __m256i sign = _mm256_set1_epi16(0x80);
    __m512 tot[4][M];
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < M; ++t) tot[r][t] = _mm512_setzero_ps();
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
        __m512 acc[4][M];
        for (int r = 0; r < 4; ++r)
            for (int t = 0; t < M; ++t) acc[r][t] = _mm512_setzero_ps();
        for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
            const uint8_t* chunk = blk.q + (k / 16) * 64;
            if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(chunk + 2048), _MM_HINT_T0);
            __m512 w[4];
            for (int r = 0; r < 4; ++r) {
                // (c + (c & 0x80)) << 7: the 7 low bits to 7..13 and the sign, doubled, to bit 15
                const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 16 * r)));
                w[r] = _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_add_epi16(c, _mm256_and_si256(c, sign)), 7));
            }
            for (int t = 0; t < M; ++t) {
                const __m512 xv = _mm512_loadu_ps(x[t] + k);
                for (int r = 0; r < 4; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
            }
        }
        for (int r = 0; r < 4; ++r) {
            const __m512 s = _mm512_set1_ps(blk.s[r][g] * kE4m3ViaF16);
            for (int t = 0; t < M; ++t) tot[r][t] = _mm512_fmadd_ps(acc[r][t], s, tot[r][t]);
        }
    }
    for (int t = 0; t < M; ++t)
        for (int r = 0; r < 4; ++r) out[t * ldo + r] = _mm512_reduce_add_ps(tot[r][t]);
}
#define MLA_MOE_QDOT_FP8 {qdot_fp8<1>, qdot_fp8<2>, qdot_fp8<3>, qdot_fp8<4>}

#if defined(__AVX512BF16__)
// MoeIsa::qdot_fp8_bf16: 32 inputs a step, a row's two 16-code chunks (k and k + 16: one 64-byte line
// apart) made one vector of 32 bf16 weights (e4m3_to_bf16x32). Half the instructions a weight of
// the f16 route (qdot_fp8), which is what bounds it at 1-2 tokens.
template <int M>
void qdot_fp8_bf16(int64_t K, int64_t group, const uint16_t* const* x, const QBlock& blk, float* out, int64_t ldo) {
    static const bool intel = __builtin_cpu_is("intel");
    const bool prefetch = intel && M <= 2;
    __m512 tot[4][M];
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < M; ++t) tot[r][t] = _mm512_setzero_ps();
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
        __m512 acc[4][M];
        for (int r = 0; r < 4; ++r)
            for (int t = 0; t < M; ++t) acc[r][t] = _mm512_setzero_ps();
        for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
            const uint8_t* line = blk.q + (k / 16) * 64;
            if (prefetch) {
                _mm_prefetch(reinterpret_cast<const char*>(line + 2048), _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char*>(line + 2048 + 64), _MM_HINT_T0);
            }
            __m512i xv[M];
            for (int t = 0; t < M; ++t) xv[t] = _mm512_loadu_si512(x[t] + k);
            for (int r = 0; r < 4; ++r) {
                const __m512i w = e4m3_to_bf16x32(line + 16 * r, line + 64 + 16 * r);
                for (int t = 0; t < M; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)w, (__m512bh)xv[t]);
            }
        }
        for (int r = 0; r < 4; ++r) {
            const __m512 s = _mm512_set1_ps(blk.s[r][g]);
            for (int t = 0; t < M; ++t) tot[r][t] = _mm512_fmadd_ps(acc[r][t], s, tot[r][t]);
        }
    }
    for (int t = 0; t < M; ++t)
        for (int r = 0; r < 4; ++r) out[t * ldo + r] = _mm512_reduce_add_ps(tot[r][t]);
}
#define MLA_MOE_FP8_BF16 {qdot_fp8_bf16<1>, qdot_fp8_bf16<2>, qdot_fp8_bf16<3>, qdot_fp8_bf16<4>}
#endif
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
// AVX2 has 16 ymm registers: the 16-lane kernels above hold 4 x M accumulators of two registers
// each plus the weights, which spills from M = 2 (measured: the f32 panel products of a 10944 x
// 2048 projection ran at ~7 GMAC/s on 2 Zen 3 cores, 14x under the FMA peak). These hold one ymm
// per accumulator, and at most 2 activation rows per pass (4 x 2 accumulators + 4 weight vectors);
// 3-4 rows run as two passes, whose second finds the weights in cache.
template <int M>
void fdot8(int64_t k0, int64_t kb, const float* const* a, const float* w, float* out, int64_t ldo) {
    __m256 acc[4][M];
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < M; ++t) acc[r][t] = _mm256_setzero_ps();
    for (int64_t p = 0; p < kb; p += 8) {
        __m256 wv[4];
        for (int r = 0; r < 4; ++r) wv[r] = _mm256_loadu_ps(w + r * kb + p);
        for (int t = 0; t < M; ++t) {
            const __m256 av = _mm256_loadu_ps(a[t] + k0 + p);
            for (int r = 0; r < 4; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], av, acc[r][t]);
        }
    }
    for (int t = 0; t < M; ++t)
        for (int r = 0; r < 4; ++r) out[t * ldo + r] += hsum8(acc[r][t]);
}
template <int M>
void fdot_avx2(int64_t k0, int64_t kb, const float* const* a, const float* w, float* out, int64_t ldo) {
    if (M <= 2) return fdot8<M <= 2 ? M : 2>(k0, kb, a, w, out, ldo);
    fdot8<2>(k0, kb, a, w, out, ldo);
    fdot8<M - 2 >= 1 ? M - 2 : 1>(k0, kb, a + 2, w, out + 2 * ldo, ldo);
}
// f32 dot products on the codes, 8 inputs a step: each row's codes become (c - zp) x s, the weights
// exactly as dequant() gives them (the group's scale and zero point broadcast once per group), so
// no zero-point term and no per-group fold of the accumulators.
template <int BITS, int M>
void qdot8(int64_t K, int64_t group, const float* const* x, const QBlock& blk, float* out, int64_t ldo) {
    __m256 acc[4][M];
    for (int r = 0; r < 4; ++r)
        for (int t = 0; t < M; ++t) acc[r][t] = _mm256_setzero_ps();
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
        __m256 sc[4], zp[4];
        for (int r = 0; r < 4; ++r) {
            sc[r] = _mm256_set1_ps(BITS == kFp8Bits ? blk.s[r][g] * kE4m3ViaF16 : blk.s[r][g]);
            zp[r] = _mm256_set1_ps(static_cast<float>(blk.zp[r][g]));
        }
        for (int64_t k = g * group; k < (g + 1) * group; k += 8) {
            __m256 wv[4];
            for (int r = 0; r < 4; ++r) {
                __m128i c8;
                if (BITS == kFp8Bits) {  // as int8's chunk, the codes widened as e4m3
                    c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.q + (k / 16) * 64 + 16 * r + (k % 16)));
                    wv[r] = _mm256_mul_ps(e4m3x8(c8), sc[r]);
                    continue;
                }
                if (BITS == 8) {  // chunk k / 16 of row r, its first or second 8 codes
                    c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.q + (k / 16) * 64 + 16 * r + (k % 16)));
                } else {  // chunk k / 32: inputs 32c..+15 in the low nibbles, 32c+16..+31 in the high ones
                    const int64_t j = k % 32;
                    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.q + (k / 32) * 64 + 16 * r + (j % 16)));
                    c8 = _mm_and_si128(j < 16 ? b : _mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
                }
                wv[r] = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c8)), zp[r]), sc[r]);
            }
            for (int t = 0; t < M; ++t) {
                const __m256 xv = _mm256_loadu_ps(x[t] + k);
                for (int r = 0; r < 4; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
    for (int t = 0; t < M; ++t)
        for (int r = 0; r < 4; ++r) out[t * ldo + r] = hsum8(acc[r][t]);
}
template <int BITS, int M>
void qdot_avx2(int64_t K, int64_t group, const float* const* x, const float* const*, const QBlock& blk, float* out,
               int64_t ldo) {
    if (M <= 2) return qdot8<BITS, M <= 2 ? M : 2>(K, group, x, blk, out, ldo);
    qdot8<BITS, 2>(K, group, x, blk, out, ldo);
    qdot8<BITS, M - 2 >= 1 ? M - 2 : 1>(K, group, x + 2, blk, out + 2 * ldo, ldo);
}
#define MLA_MOE_QDOT {{qdot_avx2<8, 1>, qdot_avx2<8, 2>, qdot_avx2<8, 3>, qdot_avx2<8, 4>}, \
                      {qdot_avx2<4, 1>, qdot_avx2<4, 2>, qdot_avx2<4, 3>, qdot_avx2<4, 4>}, \
                      {qdot_avx2<kFp8Bits, 1>, qdot_avx2<kFp8Bits, 2>, qdot_avx2<kFp8Bits, 3>, qdot_avx2<kFp8Bits, 4>}}
#define MLA_MOE_FDOT {fdot_avx2<1>, fdot_avx2<2>, fdot_avx2<3>, fdot_avx2<4>}
#else
#ifndef MLA_MOE_QDOT_FP8
#define MLA_MOE_QDOT_FP8 {qdot<kFp8Bits, 1>, qdot<kFp8Bits, 2>, qdot<kFp8Bits, 3>, qdot<kFp8Bits, 4>}
#endif
#define MLA_MOE_QDOT {{qdot<8, 1>, qdot<8, 2>, qdot<8, 3>, qdot<8, 4>}, {qdot4<1>, qdot4<2>, qdot4<3>, qdot4<4>}, \
                      MLA_MOE_QDOT_FP8}
#define MLA_MOE_FDOT {fdot<1>, fdot<2>, fdot<3>, fdot<4>}
#endif

#if defined(__AVX512VNNI__)
#ifndef MLA_PF
#define MLA_PF 1024
#endif
// NB 4-row blocks (4 or 8 rows) by M tokens on int8 activations. One 64-byte load holds 16 codes of
// each of a block's 4 rows (int8: inputs 16c..16c+15 of chunk c; int4: the low nibbles are inputs
// 32c..32c+15 and the high ones 32c+16..32c+31), so int32 lane 4r + j sums 4 products of row r;
// the token's 16 activations of the same inputs are broadcast to the 4 rows' lanes, once for all
// NB blocks. The int32 sums of an activation block (a whole number of them per weight group) go
// into the f32 totals scaled by the row's group scale times the block's d; at the group's end the
// zero point's term is subtracted (a quarter in each of the row's 4 lanes).
// Registers: NB x M int32 sums and NB x M f32 totals, so NB x M <= 8.
// Measured on the 102400 x 2048 int8 lm_head, 2 cores (qmb micro-benchmark, against a plain read
// of the same bytes): 1-2 tokens stream best with NB = 1 (NB = 2 1.2x slower). Whether a prefetch
// 1 KB ahead helps them depends on the core: on the Zen 4 EPYC it held them to 1.1-1.4x a plain
// read's time (without it they ran at read speed); on the Xeon with AMX (weights in 2 MiB pages,
// a C++ harness of this kernel, alternated builds) it takes 1 token 9.4 -> 7.8 ms (27 GB/s, a plain
// read's speed) and 2 tokens 11.0 -> 8.4-8.9 ms (256 B ahead gained less, 2 KB the same); on an
// Emerald Rapids Xeon 2 KB beat 1 KB (lm_head 1-2 rows 1.07-1.11x; the MoE op alone 1.1x, 3 KB
// alike, 4 KB less). So 1-2 tokens prefetch 2 KB ahead on Intel cores only (prefetch_few_rows).
// From 3 tokens the dot products cost as much as the reads and the two no longer overlap (8
// tokens: 14-16 ms against a 7 ms read): broadcasts shared by two blocks (NB = 2: ~230 multiply-adds/ns a core in cache
// against ~160) and a prefetch 32 KB ahead (the second 4 tokens run on cached codes, and the next
// rows must be on their way meanwhile) bring 8 tokens to ~11 ms.
inline bool prefetch_few_rows() {
    static const bool intel = __builtin_cpu_is("intel");
    return intel;
}
template <int BITS, int NB, int M>
void qdot_q8(int64_t K, int64_t group, const QRow* x, const QBlock* blk, float* out, int64_t ldo) {
    static_assert(NB * M <= 8, "accumulators beyond the registers");
    constexpr int64_t kPrefetch8 = M >= 3 ? 32768 : 2048;  // int8 codes, bytes ahead
    const bool prefetch8 = M >= 3 || prefetch_few_rows();
    const __m512i row_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const int64_t block = x[0].block;  // every row of a call has the same (q8_block(group))
    __m512 tot[NB][M];
    for (int b = 0; b < NB; ++b)
        for (int t = 0; t < M; ++t) tot[b][t] = _mm512_setzero_ps();
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
        __m512 s[NB], sz[NB];  // per lane: the row's scale, and scale x zero point / 4
        for (int b = 0; b < NB; ++b) {
            const QBlock& q = blk[b];
            s[b] = _mm512_permutexvar_ps(row_of_lane,
                                         _mm512_castps128_ps512(_mm_setr_ps(q.s[0][g], q.s[1][g], q.s[2][g], q.s[3][g])));
            sz[b] = _mm512_mul_ps(
                s[b], _mm512_permutexvar_ps(row_of_lane, _mm512_castps128_ps512(_mm_setr_ps(
                                                             0.25f * q.zp[0][g], 0.25f * q.zp[1][g],
                                                             0.25f * q.zp[2][g], 0.25f * q.zp[3][g]))));
        }
        for (int64_t b0 = g * group; b0 < (g + 1) * group; b0 += block) {
            __m512i acc[NB][M];
            for (int b = 0; b < NB; ++b)
                for (int t = 0; t < M; ++t) acc[b][t] = _mm512_setzero_si512();
            for (int64_t k = b0; k < b0 + block; k += 32) {
                __m512i lo[NB], hi[NB];  // each block's 4 rows' codes of inputs k..k+15 and k+16..k+31
                for (int b = 0; b < NB; ++b) {
                    if (BITS == 8) {
                        if (prefetch8) {
                            const char* next = reinterpret_cast<const char*>(blk[b].q + (k / 16) * 64 + kPrefetch8);
                            _mm_prefetch(next, _MM_HINT_T0);
                            _mm_prefetch(next + 64, _MM_HINT_T0);
                        }
                        lo[b] = _mm512_loadu_si512(blk[b].q + (k / 16) * 64);
                        hi[b] = _mm512_loadu_si512(blk[b].q + (k / 16) * 64 + 64);
                    } else {
                        _mm_prefetch(reinterpret_cast<const char*>(blk[b].q + (k / 32) * 64 + MLA_PF), _MM_HINT_T0);
                        const __m512i v = _mm512_loadu_si512(blk[b].q + (k / 32) * 64);
                        lo[b] = _mm512_and_si512(v, nibble);
                        hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
                    }
                }
                for (int t = 0; t < M; ++t) {
                    const __m512i xl =
                        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[t].q + k)));
                    const __m512i xh =
                        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[t].q + k + 16)));
                    for (int b = 0; b < NB; ++b)
                        acc[b][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[b][t], lo[b], xl), hi[b], xh);
                }
            }
            for (int t = 0; t < M; ++t) {
                const __m512 d = _mm512_set1_ps(x[t].d[b0 / block]);
                for (int b = 0; b < NB; ++b)
                    tot[b][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[b][t]), _mm512_mul_ps(s[b], d), tot[b][t]);
            }
        }
        for (int t = 0; t < M; ++t) {
            const __m512 gs = _mm512_set1_ps(x[t].gsum[g]);
            for (int b = 0; b < NB; ++b) tot[b][t] = _mm512_fnmadd_ps(sz[b], gs, tot[b][t]);
        }
    }
    for (int t = 0; t < M; ++t)
        for (int b = 0; b < NB; ++b) {
            alignas(64) float lanes[16];
            _mm512_store_ps(lanes, tot[b][t]);
            for (int r = 0; r < 4; ++r)
                out[t * ldo + 4 * b + r] = (lanes[4 * r] + lanes[4 * r + 1]) + (lanes[4 * r + 2] + lanes[4 * r + 3]);
        }
}

// quantize_row_q8 in 16 lanes: the same block maxima, the same products x * (127 / amax) rounded
// to nearest even (the MXCSR default, as std::nearbyint) and clamped to +-127, the same int32 sums.
// |x| enters the maximum as the first operand, so a NaN is skipped as std::max skips it.
void quantize_q8(int64_t K, int64_t group, const float* x, int8_t* q, float* d, float* gsum) {
    const int64_t block = q8_block(group);
    const __m512 sign = _mm512_set1_ps(-0.f);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t b = 0; b < K / block; ++b) {
        const float* xb = x + block * b;
        __m512 vmax = _mm512_setzero_ps();
        for (int64_t j = 0; j < block; j += 16) vmax = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + j)), vmax);
        const float amax = _mm512_reduce_max_ps(vmax);
        const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        const __m512 vinv = _mm512_set1_ps(inv);
        __m512i vsum = _mm512_setzero_si512();
        for (int64_t j = 0; j < block; j += 16) {
            const __m512i v = _mm512_min_epi32(
                _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + j), vinv)), lo), hi);
            vsum = _mm512_add_epi32(vsum, v);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q + block * b + j), _mm512_cvtepi32_epi8(v));
        }
        finish_q8_block(b, block, group, scale, _mm512_reduce_add_epi32(vsum), d, gsum);
    }
}
#define MLA_MOE_Q8_QUANTIZE quantize_q8

// int8 codes in 16-row tiles (qmatmul.hpp's tile16 layout, MlaQLinear's weights on VNNI CPUs under
// the bf16 hint; AMX CPUs run 8 rows and more on tiles, qmatmul_amx.hpp): one 64-byte load holds
// inputs 4j..4j+3 of 16 rows, row r in int32 lane r, and vpdpbusd against the token's 4
// activations broadcast to every lane adds each row's 4 products into its own lane. So one
// accumulator carries 16 rows (the 4-row layout's carries 4, and each is converted, scaled and
// folded per activation block), and nothing is added across lanes at the end. NB tiles of 16 rows
// (at q + b * 16 * K) by M activation rows; s / zp point at the first row's groups (row stride
// `groups`). Measured on the 102400 x 2048 int8 lm_head (Zen 4, 2 cores,
// a C++ harness of both kernels on the same codes in 2 MiB pages, alternated, medians of 15):
// 1-2 rows as the 4-row kernel (memory-bound), 4 rows 8.3 -> 6.2 ms, 8 rows 9.4 -> 7.6 ms.
template <int NB, int M>
void qdot_q8_t16(int64_t K, int64_t group, const QRow* x, const uint8_t* q, const float* s, const uint8_t* zp,
                 int64_t groups, float* out, int64_t ldo) {
    static_assert(NB * M <= 8, "accumulators beyond the registers");
    // 1-2 rows prefetch on Intel cores, as qdot_q8's: on the Xeon (lm_head, alternated with the 4-row
    // kernel) none 0.86-0.91x its time, 512 B 0.95-0.99x, 1 KB 1.04x, 2-4 KB 1.10-1.16x
    constexpr int64_t kT16Ahead = 2048;
    const bool prefetch = M <= 2 && prefetch_few_rows();
    const int64_t block = x[0].block;
    __m512 tot[NB][M];
    for (int b = 0; b < NB; ++b)
        for (int t = 0; t < M; ++t) tot[b][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        __m512 sv[NB], szv[NB];  // per lane: the row's scale, and scale x zero point
        for (int b = 0; b < NB; ++b) {
            alignas(64) float sl[16], zl[16];
            for (int r = 0; r < 16; ++r) {
                sl[r] = s[(16 * b + r) * groups + g];
                zl[r] = static_cast<float>(zp[(16 * b + r) * groups + g]);
            }
            sv[b] = _mm512_load_ps(sl);
            szv[b] = _mm512_mul_ps(sv[b], _mm512_load_ps(zl));
        }
        for (int64_t b0 = g * group; b0 < (g + 1) * group; b0 += block) {
            __m512i acc[NB][M];
            for (int b = 0; b < NB; ++b)
                for (int t = 0; t < M; ++t) acc[b][t] = _mm512_setzero_si512();
            for (int64_t k = b0; k < b0 + block; k += 4) {
                __m512i w[NB];
                if (prefetch)
                    for (int b = 0; b < NB; ++b)
                        _mm_prefetch(reinterpret_cast<const char*>(q + b * 16 * K + k * 16 + kT16Ahead), _MM_HINT_T0);
                for (int b = 0; b < NB; ++b) w[b] = _mm512_loadu_si512(q + b * 16 * K + k * 16);
                for (int t = 0; t < M; ++t) {
                    int32_t quad;
                    std::memcpy(&quad, x[t].q + k, 4);
                    const __m512i xb = _mm512_set1_epi32(quad);
                    for (int b = 0; b < NB; ++b) acc[b][t] = _mm512_dpbusd_epi32(acc[b][t], w[b], xb);
                }
            }
            for (int t = 0; t < M; ++t) {
                const __m512 d = _mm512_set1_ps(x[t].d[b0 / block]);
                for (int b = 0; b < NB; ++b)
                    tot[b][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[b][t]), _mm512_mul_ps(sv[b], d), tot[b][t]);
            }
        }
        for (int t = 0; t < M; ++t) {
            const __m512 gs = _mm512_set1_ps(x[t].gsum[g]);
            for (int b = 0; b < NB; ++b) tot[b][t] = _mm512_fnmadd_ps(szv[b], gs, tot[b][t]);
        }
    }
    for (int t = 0; t < M; ++t)
        for (int b = 0; b < NB; ++b) _mm512_storeu_ps(out + t * ldo + 16 * b, tot[b][t]);
}
#define MLA_MOE_Q8_T16 \
    {{qdot_q8_t16<1, 1>, qdot_q8_t16<1, 2>, qdot_q8_t16<1, 3>, qdot_q8_t16<1, 4>}, \
     {qdot_q8_t16<2, 1>, qdot_q8_t16<2, 2>, qdot_q8_t16<2, 3>, qdot_q8_t16<2, 4>}}

#elif defined(__AVX2__)
// The same products on AVX2 without VNNI, as llama.cpp's AVX2 dots do: vpmaddubsw multiplies u8 by
// s8 and adds pairs into int16 (saturating), vpmaddwd by ones adds pairs of those into int32. One
// 32-byte load holds 16 codes of 2 of a block's rows (rows 0-1, then 2-3), so int32 lanes 0-3 sum
// row 2p's products and lanes 4-7 row 2p+1's; the token's 16 activations go to both 128-bit halves.
// int4: codes 0..15 times |x| <= 127 keep a pair under 3810, so a whole activation block (<= 128
// inputs: 8 products per int16 lane) adds up in int16 and widens once per block.
// int8: codes 0..255 would saturate a pair (2 x 255 x 127); the code is taken less 128 (s8, the zero
// point's term takes the 128 back) and the sign moves onto the activation: |c - 128| <= 128 as u8
// times sign(c - 128) x <= 127 keeps a pair under 32512. Its int16 pairs widen at every step.
// The int32 block sums, the scales and the zero points' term then go as in the VNNI kernel above.
// The codes are prefetched 2 KB ahead: on Zen 3 (2 cores, lm_head-sized streams at 1-4 rows,
// variants alternated in one process) an int8 stream went from ~80% to ~95% of a plain read's
// speed with it (1 KB: between the two), an int4 one (group 128) 10-16% faster at 1-2 rows.
constexpr int64_t kPrefetch = 2048;
template <int BITS>
float zero_point_term(int64_t groups, const float* s, const uint8_t* zp, const float* gsum) {
    const float shift = BITS == 8 ? 128.f : 0.f;
    int64_t g = 0;
    float sum = 0.f;
    if (groups >= 8) {
        __m256 acc = _mm256_setzero_ps();
        for (; g + 8 <= groups; g += 8) {
            const __m256 z = _mm256_sub_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zp + g)))),
                _mm256_set1_ps(shift));
            acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(s + g), z), _mm256_loadu_ps(gsum + g), acc);
        }
        sum = hsum8(acc);
    }
    for (; g < groups; ++g) sum += s[g] * (static_cast<float>(zp[g]) - shift) * gsum[g];
    return sum;
}
template <int BITS, int M>
void qdot_q8_avx2(int64_t K, int64_t group, const QRow* x, const QBlock& blk, float* out, int64_t ldo) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i nibble = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8(static_cast<char>(0x80));
    const int64_t block = x[0].block;
    __m256 tot[2][M];
    for (int p = 0; p < 2; ++p)
        for (int t = 0; t < M; ++t) tot[p][t] = _mm256_setzero_ps();
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
        __m256 s[2];  // per lane: its row's scale
        for (int p = 0; p < 2; ++p)
            s[p] = _mm256_set_m128(_mm_set1_ps(blk.s[2 * p + 1][g]), _mm_set1_ps(blk.s[2 * p][g]));
        for (int64_t b0 = g * group; b0 < (g + 1) * group; b0 += block) {
            __m256i acc[2][M];
            for (int p = 0; p < 2; ++p)
                for (int t = 0; t < M; ++t) acc[p][t] = _mm256_setzero_si256();
            for (int64_t k = b0; k < b0 + block; k += BITS == 8 ? 16 : 32) {
                if (BITS == 8) {
                    const uint8_t* chunk = blk.q + (k / 16) * 64;
                    _mm_prefetch(reinterpret_cast<const char*>(chunk + kPrefetch), _MM_HINT_T0);
                    __m256i sw[2], aw[2];  // the codes less 128 (s8), and their magnitudes (u8)
                    for (int p = 0; p < 2; ++p) {
                        sw[p] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * p)), flip);
                        aw[p] = _mm256_abs_epi8(sw[p]);
                    }
                    for (int t = 0; t < M; ++t) {
                        const __m256i xv = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[t].q + k)));
                        for (int p = 0; p < 2; ++p)
                            acc[p][t] = _mm256_add_epi32(
                                acc[p][t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw[p], _mm256_sign_epi8(xv, sw[p])), ones));
                    }
                } else {
                    const uint8_t* chunk = blk.q + (k / 32) * 64;
                    _mm_prefetch(reinterpret_cast<const char*>(chunk + kPrefetch), _MM_HINT_T0);
                    __m256i lo[2], hi[2];
                    for (int p = 0; p < 2; ++p) {
                        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * p));
                        lo[p] = _mm256_and_si256(v, nibble);
                        hi[p] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
                    }
                    for (int t = 0; t < M; ++t) {
                        const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[t].q + k)));
                        const __m256i xh = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[t].q + k + 16)));
                        for (int p = 0; p < 2; ++p)  // int16 sums here, widened after the block
                            acc[p][t] = _mm256_add_epi16(acc[p][t], _mm256_add_epi16(_mm256_maddubs_epi16(lo[p], xl),
                                                                                    _mm256_maddubs_epi16(hi[p], xh)));
                    }
                }
            }
            for (int t = 0; t < M; ++t) {
                const __m256 d = _mm256_set1_ps(x[t].d[b0 / block]);
                for (int p = 0; p < 2; ++p) {
                    const __m256i sums = BITS == 8 ? acc[p][t] : _mm256_madd_epi16(acc[p][t], ones);
                    tot[p][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(s[p], d), tot[p][t]);
                }
            }
        }
    }
    // The zero points' term, sum over groups of scale x (zero point - shift) x gsum, 8 groups a step
    // once per row and token (per group inside the loop above it cost as much as the products of
    // a 128-input int4 group at one token).
    for (int t = 0; t < M; ++t)
        for (int p = 0; p < 2; ++p) {
            alignas(32) float lanes[8];
            _mm256_store_ps(lanes, tot[p][t]);
            for (int r = 0; r < 2; ++r)
                out[t * ldo + 2 * p + r] = (lanes[4 * r] + lanes[4 * r + 1]) + (lanes[4 * r + 2] + lanes[4 * r + 3]) -
                                           zero_point_term<BITS>(groups, blk.s[2 * p + r], blk.zp[2 * p + r], x[t].gsum);
        }
}
// The table's two-block entries (the AVX-512 kernel shares its broadcasts between 2 blocks): here
// the registers hold one block's sums, so one block after the other.
template <int BITS, int NB, int M>
void qdot_q8(int64_t K, int64_t group, const QRow* x, const QBlock* blk, float* out, int64_t ldo) {
    for (int b = 0; b < NB; ++b) qdot_q8_avx2<BITS, M>(K, group, x, blk[b], out + 4 * b, ldo);
}

// quantize_row_q8 in 8 lanes, bit for bit as the AVX-512 version above; 32 inputs a step (a block
// is 32, 64 or 128), packed to int8 by two saturating packs and one lane permutation.
void quantize_q8(int64_t K, int64_t group, const float* x, int8_t* q, float* d, float* gsum) {
    const int64_t block = q8_block(group);
    const __m256 sign = _mm256_set1_ps(-0.f);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < K / block; ++b) {
        const float* xb = x + block * b;
        __m256 vmax = _mm256_setzero_ps();
        for (int64_t j = 0; j < block; j += 8) vmax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)), vmax);
        alignas(32) float m8[8];
        _mm256_store_ps(m8, vmax);
        float amax = 0.f;
        for (float v : m8) amax = std::max(amax, v);
        const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        const __m256 vinv = _mm256_set1_ps(inv);
        __m256i vsum = _mm256_setzero_si256();
        for (int64_t j = 0; j < block; j += 32) {
            __m256i v[4];
            for (int i = 0; i < 4; ++i) {
                v[i] = _mm256_min_epi32(
                    _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8 * i), vinv)), lo), hi);
                vsum = _mm256_add_epi32(vsum, v[i]);
            }
            const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + block * b + j), _mm256_permutevar8x32_epi32(packed, order));
        }
        alignas(32) int32_t s8[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(s8), vsum);
        int32_t sum = 0;
        for (int32_t v : s8) sum += v;
        finish_q8_block(b, block, group, scale, sum, d, gsum);
    }
}
#define MLA_MOE_Q8_QUANTIZE quantize_q8
#else
#define MLA_MOE_Q8_QUANTIZE quantize_row_q8
#endif
// The int8-dot entries: qdot_q8<BITS, NB, M> of the VNNI or the AVX2 kernel above; none elsewhere.
#if defined(__AVX512VNNI__) || defined(__AVX2__)
#define MLA_MOE_Q8                                                                                  \
    {{{qdot_q8<8, 1, 1>, qdot_q8<8, 1, 2>, qdot_q8<8, 1, 3>, qdot_q8<8, 1, 4>},                     \
      {qdot_q8<8, 2, 1>, qdot_q8<8, 2, 2>, qdot_q8<8, 2, 3>, qdot_q8<8, 2, 4>}},                    \
     {{qdot_q8<4, 1, 1>, qdot_q8<4, 1, 2>, qdot_q8<4, 1, 3>, qdot_q8<4, 1, 4>},                     \
      {qdot_q8<4, 2, 1>, qdot_q8<4, 2, 2>, qdot_q8<4, 2, 3>, qdot_q8<4, 2, 4>}}}
#else
#define MLA_MOE_Q8 {}
#endif
#ifndef MLA_MOE_Q8_T16
#define MLA_MOE_Q8_T16 {}
#endif
#ifndef MLA_MOE_FP8_BF16
#define MLA_MOE_FP8_BF16 {}
#endif


}  // namespace

extern const MoeIsa MLA_MOE_TABLE;  // external linkage: moe_experts.cpp picks it
const MoeIsa MLA_MOE_TABLE = {
    MLA_MOE_NAME,
    MLA_MOE_QDOT,
    {dequant<8>, dequant<4>, dequant<kFp8Bits>},
    MLA_MOE_FDOT,
    MLA_MOE_Q8,
    MLA_MOE_Q8_QUANTIZE,
    MLA_MOE_Q8_T16,
    MLA_MOE_FP8_BF16,
};

}  // namespace MLA_MOE_NS
}  // namespace mla
