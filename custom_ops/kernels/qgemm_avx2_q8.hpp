// An ISA-only island of qgemm_impl.hpp: the AVX2 table's int8-activation dots (vpmaddubsw + vpmaddwd)
// and its quantiser. Included only by qgemm_impl.hpp, inside its namespaces and under its #if for this
// ISA, so the code compiles exactly as if it stood there (no include guard, no includes of its own).
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
#define MLA_QGEMM_Q8_QUANTIZE quantize_q8
