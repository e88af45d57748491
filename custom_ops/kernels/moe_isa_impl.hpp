// The fused MoE op's vector kernels (see moe_isa.hpp), written once with GCC/Clang vector
// extensions: a 16-lane float vector becomes one zmm with AVX-512, two ymm with AVX2 and four xmm
// on the baseline, so the same source serves every table. Included by one .cpp per instruction
// set, which defines MLA_MOE_NS and MLA_MOE_TABLE.
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "moe_isa.hpp"

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
inline float hsum(vf v) {
    float s = 0.f;
    for (int i = 0; i < 16; ++i) s += v[i];
    return s;
}

// Four rows by M tokens; the accumulators of one group are folded into the totals with the
// group's scale, and the zero points are taken out once per group through sum(x) over the group.
template <int BITS, int M>
void qdot(int64_t K, int64_t group, const float* const* x, const float* const* xsum, const QRow* rows, float* out,
          int64_t ldo, int64_t pf) {
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
        if (BITS == 8) {
            for (int64_t k = k0; k < k1; k += 16) {
                if (k % 64 == 0)
                    for (int r = 0; r < 4; ++r) __builtin_prefetch(rows[r].q + k + pf, 0, 0);
                vf w[4];
                for (int r = 0; r < 4; ++r) w[r] = widen(loadb(rows[r].q + k));
                for (int t = 0; t < M; ++t) {
                    const vf xv = loadf(x[t] + k);
                    for (int r = 0; r < 4; ++r) acc[r][t] += w[r] * xv;
                }
            }
        } else {
            for (int64_t k = k0; k < k1; k += 32) {
                if (k % 128 == 0)
                    for (int r = 0; r < 4; ++r) __builtin_prefetch(rows[r].q + k / 2 + pf, 0, 0);
                vf lo[4], hi[4];
                for (int r = 0; r < 4; ++r) {
                    const vb b = loadb(rows[r].q + k / 2);
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
            const float s = rows[r].s[g], sz = s * static_cast<float>(rows[r].zp[g]);
            for (int t = 0; t < M; ++t) {
                tot[r][t] += acc[r][t] * s;
                corr[r][t] += sz * xsum[t][g];
            }
        }
    }
    for (int t = 0; t < M; ++t)
        for (int r = 0; r < 4; ++r) out[t * ldo + r] = hsum(tot[r][t]) - corr[r][t];
}

template <int BITS>
void dequant(int64_t n, const QRow* rows, int64_t k0, int64_t kb, int64_t group, float* dst) {
    for (int64_t r = 0; r < n; ++r) {
        const QRow& row = rows[r];
        float* d = dst + r * kb;
        for (int64_t p = 0; p < kb; p += 32) {
            const int64_t k = k0 + p, g = k / group;  // 32 | group: a block never straddles groups
            const vf s = vf{} + row.s[g], z = vf{} + static_cast<float>(row.zp[g]);
            if (BITS == 8) {
                storef(d + p, (widen(loadb(row.q + k)) - z) * s);
                storef(d + p + 16, (widen(loadb(row.q + k + 16)) - z) * s);
            } else {
                const vb b = loadb(row.q + k / 2);
                storef(d + p, (widen(b & 15) - z) * s);
                storef(d + p + 16, (widen(b >> 4) - z) * s);
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

}  // namespace

extern const MoeIsa MLA_MOE_TABLE;  // external linkage: moe_experts.cpp picks it
const MoeIsa MLA_MOE_TABLE = {
    MLA_MOE_NAME,
    {{qdot<8, 1>, qdot<8, 2>, qdot<8, 3>, qdot<8, 4>}, {qdot<4, 1>, qdot<4, 2>, qdot<4, 3>, qdot<4, 4>}},
    {dequant<8>, dequant<4>},
    {fdot<1>, fdot<2>, fdot<3>, fdot<4>},
};

}  // namespace MLA_MOE_NS
}  // namespace mla
