// An ISA-only island of qgemm_impl.hpp: the AVX2 table's f32 dots and panels (8-lane halves of the
// generic code's 16 lanes). Included only by qgemm_impl.hpp, inside its namespaces and under its #if
// for this ISA, so the code compiles exactly as if it stood there (no include guard, no includes of
// its own).
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
#define MLA_QGEMM_QDOT {{qdot_avx2<8, 1>, qdot_avx2<8, 2>, qdot_avx2<8, 3>, qdot_avx2<8, 4>}, \
                      {qdot_avx2<4, 1>, qdot_avx2<4, 2>, qdot_avx2<4, 3>, qdot_avx2<4, 4>}, \
                      {qdot_avx2<kFp8Bits, 1>, qdot_avx2<kFp8Bits, 2>, qdot_avx2<kFp8Bits, 3>, qdot_avx2<kFp8Bits, 4>}}
#define MLA_QGEMM_FDOT {fdot_avx2<1>, fdot_avx2<2>, fdot_avx2<3>, fdot_avx2<4>}
