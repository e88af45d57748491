// An ISA-only island of qgemm_impl.hpp: the AVX-512 VNNI table's int8-activation dots (vpdpbusd), its
// quantiser and the tile16 dots. Included only by qgemm_impl.hpp, inside its namespaces and under its
// #if for this ISA, so the code compiles exactly as if it stood there (no include guard, no includes
// of its own).
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
    static const bool intel = __builtin_cpu_is("intel");  // a vendor tuning, not a feature: stays inline
    return intel;
}
// Group g's factors of a 4-row block in qdot_q8's lanes (lane 4r + j: row r): the row's scale, and
// its scale x zero point / 4 (each of the row's 4 lanes subtracts a quarter of the zero point's term).
inline void q8_group_lanes(const QBlock& q, int64_t g, __m512i row_of_lane, __m512& s, __m512& sz) {
    s = _mm512_permutexvar_ps(row_of_lane, _mm512_castps128_ps512(_mm_setr_ps(q.s[0][g], q.s[1][g], q.s[2][g], q.s[3][g])));
    sz = _mm512_mul_ps(s, _mm512_permutexvar_ps(row_of_lane,
                                                _mm512_castps128_ps512(_mm_setr_ps(0.25f * q.zp[0][g], 0.25f * q.zp[1][g],
                                                                                   0.25f * q.zp[2][g], 0.25f * q.zp[3][g]))));
}
// Every group's factors of blk at out (kQ8LaneFloats a group), the same values q8_group_lanes gives.
void q8_lanes(int64_t groups, const QBlock& blk, float* out) {
    const __m512i row_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int64_t g = 0; g < groups; ++g) {
        __m512 s, sz;
        q8_group_lanes(blk, g, row_of_lane, s, sz);
        _mm512_store_ps(out + g * kQ8LaneFloats, s);
        _mm512_store_ps(out + g * kQ8LaneFloats + 16, sz);
    }
}
#define MLA_QGEMM_Q8_LANES q8_lanes
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
            if (blk[b].lanes) {  // written once for many passes (q8_lanes)
                s[b] = _mm512_load_ps(blk[b].lanes + g * kQ8LaneFloats);
                sz[b] = _mm512_load_ps(blk[b].lanes + g * kQ8LaneFloats + 16);
            } else {
                q8_group_lanes(blk[b], g, row_of_lane, s[b], sz[b]);
            }
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
#define MLA_QGEMM_Q8_QUANTIZE quantize_q8

// int8 codes in 16-row tiles (qmatmul.hpp's tile16 layout, MlaQLinear's weights on VNNI CPUs under
// the bf16 hint; AMX CPUs run 8 rows and more on tiles, qmatmul_amx.hpp): one 64-byte load holds
// inputs 4j..4j+3 of 16 rows, row r in int32 lane r, and vpdpbusd against the token's 4
// activations broadcast to every lane adds each row's 4 products into its own lane. So one
// accumulator carries 16 rows (the 4-row layout's carries 4, and each is converted, scaled and
// folded per activation block), and nothing is added across lanes at the end. NB tiles of 16 rows
// (the b-th `step` rows after the first: at q + b * step * K) by M activation rows; s / zp point at
// the first row's groups (row stride `groups`). Measured on the 102400 x 2048 int8 lm_head (Zen 4, 2 cores,
// a C++ harness of both kernels on the same codes in 2 MiB pages, alternated, medians of 15):
// 1-2 rows as the 4-row kernel (memory-bound), 4 rows 8.3 -> 6.2 ms, 8 rows 9.4 -> 7.6 ms.
template <int BITS, int NB, int M>
void qdot_q8_t16(int64_t K, int64_t group, const QRow* x, const uint8_t* q, const float* s, const uint8_t* zp,
                 int64_t groups, int64_t step, float* out, int64_t ldo) {
    // accumulator chains a tile and token: one vpdpbusd a line, so one tile at 1-2 tokens in a single
    // chain waits on its own latency whenever the memory keeps up (the 102400 x 2048 lm_head, Zen 4,
    // 2 threads, alternated in one process: 1 token, 4 chains 0.86-0.96 of a plain read at 48-55 GB/s
    // against one chain's 0.75 and two tiles side by side's 0.81, level at 30-36 GB/s; 2 tokens
    // within the noise at 30-36 GB/s). Two tiles side by side (an MoE's gate and up) keep one chain
    // each: 2 chains a tile there measured no better for int8. int4 lines carry two products each
    // (low and high nibbles), which take two chains where the registers allow.
    constexpr int C = NB > 1 || M > 2 ? (BITS == 4 && NB * M <= 4 ? 2 : 1) : 4;
    static_assert(NB * M * C <= 8, "accumulators beyond the registers");
    // A run of 32 inputs is 8 lines of int8 codes (line l: inputs 4l..4l+3), or 4 lines of int4
    // codes: the tile16 layout keeps the 4-row layout's bytes whole, so line l's low nibbles are
    // inputs 4l..4l+3 and its high ones 16 + 4l..16 + 4l + 3 (qgemm.hpp's int4 chunk).
    constexpr int kLines = BITS == 8 ? 8 : 4;
    const int64_t row_bytes = K * BITS / 8;
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    // 1-2 rows prefetch on Intel cores, as qdot_q8's: on the Xeon (lm_head, alternated with the 4-row
    // kernel) none 0.86-0.91x its time, 512 B 0.95-0.99x, 1 KB 1.04x, 2-4 KB 1.10-1.16x
    // int4 codes prefetch MLA_PF bytes ahead at every row count on every core, as qdot_q8's int4 do,
    // except two tiles side by side (an MoE's gate and up) at 1-2 tokens on AMD cores: there the
    // hardware prefetchers' two streams ran faster alone (tools/kernels/qdot_stream.cpp's MoE cases,
    // Zen 4, 2 threads, 4 runs alternated in one process: 1 token 0.71-0.76 -> 0.74-0.85 of a
    // plain read, 2 tokens 0.68-0.79 -> 0.80-0.83; one tile alone was faster with it at 2 tokens).
    constexpr int64_t kT16Ahead = BITS == 4 ? MLA_PF : 2048;
    const bool prefetch = BITS == 4 ? (NB == 1 || M > 2 || prefetch_few_rows()) : (M <= 2 && prefetch_few_rows());
    // A group's 16 scales (a line) and zero points (a quarter line) are a stream of their own beside
    // the codes, too short for the hardware prefetchers to follow: at groups of 128 each group's
    // factors were a demand miss every 1 KB of int4 codes a tile. Prefetched two groups ahead (same
    // runs, int4 groups of 128, 1 token: one tile 0.80-0.87 -> 0.87-1.03 of the read, the MoE's
    // gate and up side by side 0.83-0.97 -> 0.88-1.09). Per-channel factors (one group) need none.
    const int64_t block = x[0].block;
    __m512 tot[NB][M];
    for (int b = 0; b < NB; ++b)
        for (int t = 0; t < M; ++t) tot[b][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        __m512 sv[NB], szv[NB];  // per lane: the row's scale, and scale x zero point (the tile's 16 a group)
        for (int b = 0; b < NB; ++b) {
            sv[b] = _mm512_loadu_ps(s + step * b * groups + 16 * g);
            const __m128i z = _mm_loadu_si128(reinterpret_cast<const __m128i*>(zp + step * b * groups + 16 * g));
            szv[b] = _mm512_mul_ps(sv[b], _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(z)));
            if (g + 2 < groups) {
                _mm_prefetch(reinterpret_cast<const char*>(s + step * b * groups + 16 * (g + 2)), _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char*>(zp + step * b * groups + 16 * (g + 2)), _MM_HINT_T0);
            }
        }
        for (int64_t b0 = g * group; b0 < (g + 1) * group; b0 += block) {
            __m512i acc[NB][M][C];
            for (int b = 0; b < NB; ++b)
                for (int t = 0; t < M; ++t)
                    for (int c = 0; c < C; ++c) acc[b][t][c] = _mm512_setzero_si512();
            for (int64_t k = b0; k < b0 + block; k += 32) {  // block: a multiple of 32 inputs
                const uint8_t* run = q + k * BITS * 2;  // the lines of inputs k..k+31
                for (int l = 0; l < kLines; ++l) {
                    const int c = (BITS == 8 ? l : 2 * l) % C, ch = (2 * l + 1) % C;  // int4: ch for the high nibbles
                    __m512i w[NB], wh[NB];
                    if (prefetch)
                        for (int b = 0; b < NB; ++b)
                            _mm_prefetch(reinterpret_cast<const char*>(run + b * step * row_bytes + 64 * l + kT16Ahead),
                                         _MM_HINT_T0);
                    for (int b = 0; b < NB; ++b) {
                        w[b] = _mm512_loadu_si512(run + b * step * row_bytes + 64 * l);
                        if (BITS == 4) {
                            wh[b] = _mm512_and_si512(_mm512_srli_epi16(w[b], 4), nibble);
                            w[b] = _mm512_and_si512(w[b], nibble);
                        }
                    }
                    for (int t = 0; t < M; ++t) {
                        int32_t quad;
                        std::memcpy(&quad, x[t].q + k + 4 * l, 4);
                        const __m512i xb = _mm512_set1_epi32(quad);
                        for (int b = 0; b < NB; ++b) acc[b][t][c] = _mm512_dpbusd_epi32(acc[b][t][c], w[b], xb);
                        if (BITS == 4) {
                            std::memcpy(&quad, x[t].q + k + 16 + 4 * l, 4);
                            const __m512i xh = _mm512_set1_epi32(quad);
                            for (int b = 0; b < NB; ++b) acc[b][t][ch] = _mm512_dpbusd_epi32(acc[b][t][ch], wh[b], xh);
                        }
                    }
                }
            }
            for (int t = 0; t < M; ++t) {
                const __m512 d = _mm512_set1_ps(x[t].d[b0 / block]);
                for (int b = 0; b < NB; ++b) {
                    __m512i sum = acc[b][t][0];
                    for (int c = 1; c < C; ++c) sum = _mm512_add_epi32(sum, acc[b][t][c]);
                    tot[b][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(sv[b], d), tot[b][t]);
                }
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
#define MLA_Q8_T16_BITS(B) \
    {{qdot_q8_t16<B, 1, 1>, qdot_q8_t16<B, 1, 2>, qdot_q8_t16<B, 1, 3>, qdot_q8_t16<B, 1, 4>}, \
     {qdot_q8_t16<B, 2, 1>, qdot_q8_t16<B, 2, 2>, qdot_q8_t16<B, 2, 3>, qdot_q8_t16<B, 2, 4>}}
#define MLA_QGEMM_Q8_T16 {MLA_Q8_T16_BITS(8), MLA_Q8_T16_BITS(4)}  // [bits index: int8, int4]

