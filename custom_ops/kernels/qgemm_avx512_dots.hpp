// An ISA-only island of qgemm_impl.hpp: the AVX-512 table's f32 dots: int4 codes through a lookup, fp8
// codes, and fp8 codes on bf16 rows (AVX512-BF16). Included only by qgemm_impl.hpp, inside its
// namespaces and under its #if for this ISA, so the code compiles exactly as if it stood there (no
// include guard, no includes of its own).
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
#define MLA_QGEMM_QDOT_FP8 {qdot_fp8<1>, qdot_fp8<2>, qdot_fp8<3>, qdot_fp8<4>}

#if defined(__AVX512BF16__)
// fp8_codes=lut (kernel_config.hpp): e4m3 codes widened to bf16 by two AVX512-VBMI byte lookups a
// 64-byte line (the high and the low byte of each bf16, from 128-entry tables indexed by the code's
// 7 bits below the sign; the sign ORed into the high byte), then interleaved into words per
// 128-bit lane: a line holds 16 codes of each of the block's 4 rows, one row a lane, so the two
// unpacks give each lane its row's codes k..k+7 and k+8..k+15, dotted with the activations k..k+7
// and k+8..k+15 broadcast to all four lanes. 7 instructions widen 64 codes where the shifts take
// ~18, and each lane accumulates its own row, so 4 rows x M tokens need M accumulators. The tables
// hold exactly what e4m3_to_bf16x32 computes (exponent 0, the subnormal codes and zero: signed zero).
// From 3 tokens the codes are prefetched 32 KB ahead, as the int8 dots do (qgemm_vnni_q8.hpp): the
// widening and 2M dots a line are slow enough that the hardware prefetcher alone lets the line's
// load stall (perf on the Zen 4: the instruction after the load held 14% of the op's samples);
// measured on one 21888 x 2048 MlaQLinear, 8 rows, 2 threads (fp8 against int8, alternated):
// 1.87x int8's time without, 1.39-1.48x with (2 to 64 KB ahead alike).
struct E4m3Bf16Bytes {
    alignas(64) uint8_t hi[128], lo[128];
    E4m3Bf16Bytes() {
        for (int c = 0; c < 128; ++c) {
            const int u = c << 4;
            const uint16_t v = (c & 0x78) ? static_cast<uint16_t>((u & 0x7F0) + (120 << 7)) : 0;
            hi[c] = static_cast<uint8_t>(v >> 8);
            lo[c] = static_cast<uint8_t>(v & 0xFF);
        }
    }
};

// The two bf16 vectors of one 64-byte line of codes (wa: each row's inputs k..k+7 in its lane, wb:
// k+8..k+15), widened by the lookups above.
struct E4m3Lut {
    __m512i hi0, hi1, lo0, lo1, sign;
    __attribute__((target("avx512vbmi"))) E4m3Lut() {
        static const E4m3Bf16Bytes tables;
        hi0 = _mm512_load_si512(tables.hi), hi1 = _mm512_load_si512(tables.hi + 64);
        lo0 = _mm512_load_si512(tables.lo), lo1 = _mm512_load_si512(tables.lo + 64);
        sign = _mm512_set1_epi8(static_cast<char>(0x80));
    }
    __attribute__((target("avx512vbmi"))) void widen(const uint8_t* line, __m512i& wa, __m512i& wb) const {
        widen_codes(_mm512_loadu_si512(line), wa, wb);
    }
    // The same for 64 codes already in a register.
    __attribute__((target("avx512vbmi"))) void widen_codes(__m512i c, __m512i& wa, __m512i& wb) const {
        const __m512i h = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, c, hi1), c, sign, 0xF8);
        const __m512i l = _mm512_permutex2var_epi8(lo0, c, lo1);
        wa = _mm512_unpacklo_epi8(l, h), wb = _mm512_unpackhi_epi8(l, h);
    }
};

// A 4-row block's codes widened once into bf16 lines (for each line of codes, its wa then wb: 128
// bytes), which every pass of qdot_bf16_lines then reads in place of widening the codes again: for
// many rows of x (prefill), where the lookups would otherwise be repeated every 8 rows.
__attribute__((target("avx512vbmi"))) void widen_fp8_lines(int64_t K, const uint8_t* q, uint16_t* lines) {
    const E4m3Lut lut;
    for (int64_t c = 0; c < K / 16; ++c) {
        __m512i wa, wb;
        lut.widen(q + c * 64, wa, wb);
        _mm512_store_si512(lines + c * 64, wa);
        _mm512_store_si512(lines + c * 64 + 32, wb);
    }
}

// M tokens (up to 8) against one 4-row block: its codes widened line by line (LINES false), or its
// widened lines read (LINES true: `lines` from widen_fp8_lines).
template <int M, bool LINES>
__attribute__((target("avx512vbmi"))) void fp8_bf16_dots(int64_t K, int64_t group, const uint16_t* const* x,
                                                         const uint16_t* lines, const QBlock& blk, float* out,
                                                         int64_t ldo) {
    constexpr int64_t kPrefetch = 32768;  // bytes ahead, from 3 tokens
    const E4m3Lut lut;
    const __m512i lane_of = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 tot[M];
    for (int t = 0; t < M; ++t) tot[t] = _mm512_setzero_ps();
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
        __m512 acc[M];
        for (int t = 0; t < M; ++t) acc[t] = _mm512_setzero_ps();
        for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
            __m512i wa, wb;
            if (LINES) {
                wa = _mm512_load_si512(lines + (k / 16) * 64);
                wb = _mm512_load_si512(lines + (k / 16) * 64 + 32);
            } else {
                if (M >= 3) _mm_prefetch(reinterpret_cast<const char*>(blk.q + (k / 16) * 64 + kPrefetch), _MM_HINT_T0);
                lut.widen(blk.q + (k / 16) * 64, wa, wb);
            }
            for (int t = 0; t < M; ++t) {
                const __m512i xa = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[t] + k)));
                const __m512i xb = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[t] + k + 8)));
                acc[t] = _mm512_dpbf16_ps(acc[t], (__m512bh)wa, (__m512bh)xa);
                acc[t] = _mm512_dpbf16_ps(acc[t], (__m512bh)wb, (__m512bh)xb);
            }
        }
        const __m128 s4 = _mm_setr_ps(blk.s[0][g], blk.s[1][g], blk.s[2][g], blk.s[3][g]);
        const __m512 s = _mm512_permutexvar_ps(lane_of, _mm512_castps128_ps512(s4));  // lane r: row r's scale
        for (int t = 0; t < M; ++t) tot[t] = _mm512_fmadd_ps(acc[t], s, tot[t]);
    }
    const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int t = 0; t < M; ++t) {
        __m512 v = _mm512_add_ps(tot[t], _mm512_permute_ps(tot[t], 0xB1));  // within each lane: pairs
        v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));                  // then halves: the lane's sum
        _mm_storeu_ps(out + t * ldo, _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, v)));  // rows 0..3
    }
}

template <int M>
void qdot_fp8_bf16_lut(int64_t K, int64_t group, const uint16_t* const* x, const QBlock& blk, float* out,
                       int64_t ldo) {
    fp8_bf16_dots<M, false>(K, group, x, nullptr, blk, out, ldo);
}

template <int M>
void qdot_bf16_lines(int64_t K, int64_t group, const uint16_t* const* x, const uint16_t* lines, const QBlock& blk,
                     float* out, int64_t ldo) {
    fp8_bf16_dots<M, true>(K, group, x, lines, blk, out, ldo);
}

// QgemmIsa::qdot_fp8_bf16: 32 inputs a step, a row's two 16-code chunks (k and k + 16: one 64-byte line
// apart) made one vector of 32 bf16 weights (e4m3_to_bf16x32). Half the instructions a weight of
// the f16 route (qdot_fp8), which is what bounds it at 1-2 tokens. Under fp8_codes=lut the VBMI
// lookups above instead (their own table entries: qtile picks them).
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
// fp8 codes in 16-row tiles (qmatmul.hpp's tile16 layout, as int8's: inputs 4j..4j+3 of 16 rows in
// one 64-byte line, row r at bytes 4r..4r+3) on bf16 rows, under fp8_codes=lut. One vpermb orders
// each 16-byte lane's codes (4 rows x 4 inputs) as the 4 rows' inputs 4j, 4j+1, then their 4j+2,
// 4j+3, so that after E4m3Lut's lookups and unpacks `wa` holds the pair (4j, 4j+1) of all 16 rows,
// row r in dword r, and `wb` the pair (4j+2, 4j+3). Each vdpbf16ps then takes the token's pair as an
// embedded 32-bit broadcast from memory: no broadcast instruction, one accumulator carries 16 rows
// (the 4-row lookups' carries 4, and needs two 128-bit broadcasts a line a token), and nothing is
// added across lanes at the end. A line at 8 tokens: 6 instructions widen it, 16 dot products use
// it. At 1-2 tokens `wb` sums into a second accumulator: one chain of dependent dot products would
// hold a line for two of their latencies. Every line is prefetched 4 KB ahead: the widening's
// latency keeps too few loads in flight for the hardware prefetcher alone.
// NB tiles of 16 rows (the b-th `step` rows after the first: at q + b * step * K) by M tokens; s
// points at the tile's scales (the tile16 layout's: 16 a group); out[t * ldo + 16 * b + r]. Measured on a 21888 x 2048 matrix streamed from
// memory (Zen 4, 2 threads, alternated in one process, tools/kernels/fp8_tiles.cpp; int8 =
// qdot_q8_t16 on the same bytes): 8 tokens, the 4-row lookups 1.43-1.67x int8's time, these (NB 2)
// 1.07-1.17x (1.25x in a scratch copy with the 4-row lookups' prefetch, 32 KB ahead every other
// line); 1 token 1.0-1.18x, as the 4-row lookups (0.92-1.15x): both are bound by the widening
// where the memory is fast. The dot products alone are 2x int8's at 8 tokens (32 multiply-adds an
// instruction against vpdpbusd's 64).
template <int NB, int M>
__attribute__((target("avx512vbmi"))) void qdot_fp8_t16(int64_t K, int64_t group, const uint16_t* const* x,
                                                        const uint8_t* q, const float* s, int64_t groups, int64_t step,
                                                        float* out, int64_t ldo) {
    constexpr int C = M <= 2 ? 2 : 1;  // accumulators a tile and token
    static_assert(NB * M * C <= 16, "accumulators beyond the registers");
    constexpr int64_t kPrefetch = 4096;
    const E4m3Lut lut;
    alignas(64) static const uint8_t kPairs[64] = {
#define MLA_T16_LANE(L) 16 * L + 0, 16 * L + 1, 16 * L + 4, 16 * L + 5, 16 * L + 8, 16 * L + 9, 16 * L + 12, 16 * L + 13, \
                        16 * L + 2, 16 * L + 3, 16 * L + 6, 16 * L + 7, 16 * L + 10, 16 * L + 11, 16 * L + 14, 16 * L + 15
        MLA_T16_LANE(0), MLA_T16_LANE(1), MLA_T16_LANE(2), MLA_T16_LANE(3)
#undef MLA_T16_LANE
    };
    const __m512i pairs = _mm512_load_si512(kPairs);
    __m512 tot[NB][M];
    for (int b = 0; b < NB; ++b)
        for (int t = 0; t < M; ++t) tot[b][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < K / group; ++g) {
        __m512 acc[NB][M][C];
        for (int b = 0; b < NB; ++b)
            for (int t = 0; t < M; ++t)
                for (int c = 0; c < C; ++c) acc[b][t][c] = _mm512_setzero_ps();
        for (int64_t k = g * group; k < (g + 1) * group; k += 4) {
            __m512i wa[NB], wb[NB];
            for (int b = 0; b < NB; ++b) {
                const uint8_t* line = q + b * step * K + k * 16;
                _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetch), _MM_HINT_T0);
                lut.widen_codes(_mm512_permutexvar_epi8(pairs, _mm512_loadu_si512(line)), wa[b], wb[b]);
            }
            for (int t = 0; t < M; ++t) {
                int32_t p0, p1;  // the token's inputs (4j, 4j+1) and (4j+2, 4j+3): embedded broadcasts
                std::memcpy(&p0, x[t] + k, 4);
                std::memcpy(&p1, x[t] + k + 2, 4);
                const __m512i x0 = _mm512_set1_epi32(p0), x1 = _mm512_set1_epi32(p1);
                for (int b = 0; b < NB; ++b) {
                    acc[b][t][0] = _mm512_dpbf16_ps(acc[b][t][0], (__m512bh)wa[b], (__m512bh)x0);
                    acc[b][t][C - 1] = _mm512_dpbf16_ps(acc[b][t][C - 1], (__m512bh)wb[b], (__m512bh)x1);
                }
            }
        }
        for (int b = 0; b < NB; ++b) {
            const __m512 sv = _mm512_loadu_ps(s + step * b * groups + 16 * g);  // lane r: row r's scale
            for (int t = 0; t < M; ++t) {
                const __m512 sum = C == 2 ? _mm512_add_ps(acc[b][t][0], acc[b][t][C - 1]) : acc[b][t][0];
                tot[b][t] = _mm512_fmadd_ps(sum, sv, tot[b][t]);
            }
        }
    }
    for (int t = 0; t < M; ++t)
        for (int b = 0; b < NB; ++b) _mm512_storeu_ps(out + t * ldo + 16 * b, tot[b][t]);
}

#define MLA_QGEMM_FP8_BF16 {qdot_fp8_bf16<1>, qdot_fp8_bf16<2>, qdot_fp8_bf16<3>, qdot_fp8_bf16<4>}
#define MLA_QGEMM_FP8_BF16_LUT {qdot_fp8_bf16_lut<1>, qdot_fp8_bf16_lut<2>, qdot_fp8_bf16_lut<3>, qdot_fp8_bf16_lut<4>, \
                                qdot_fp8_bf16_lut<5>, qdot_fp8_bf16_lut<6>, qdot_fp8_bf16_lut<7>, qdot_fp8_bf16_lut<8>}
#define MLA_QGEMM_FP8_LINES widen_fp8_lines
#define MLA_QGEMM_FP8_T16                                                                                     \
    {{qdot_fp8_t16<1, 1>, qdot_fp8_t16<1, 2>, qdot_fp8_t16<1, 3>, qdot_fp8_t16<1, 4>, qdot_fp8_t16<1, 5>,     \
      qdot_fp8_t16<1, 6>, qdot_fp8_t16<1, 7>, qdot_fp8_t16<1, 8>},                                            \
     {qdot_fp8_t16<2, 1>, qdot_fp8_t16<2, 2>, qdot_fp8_t16<2, 3>, qdot_fp8_t16<2, 4>, qdot_fp8_t16<2, 5>,     \
      qdot_fp8_t16<2, 6>, qdot_fp8_t16<2, 7>, qdot_fp8_t16<2, 8>}}
#define MLA_QGEMM_BF16_LINES {qdot_bf16_lines<1>, qdot_bf16_lines<2>, qdot_bf16_lines<3>, qdot_bf16_lines<4>, \
                              qdot_bf16_lines<5>, qdot_bf16_lines<6>, qdot_bf16_lines<7>, qdot_bf16_lines<8>}
#endif
