// AVX512-BF16 dot products for the attention's expanded form (see prefill_bf16.hpp). Compiled with
// -mavx512f/bw/vl/dq -mavx512bf16 (CMakeLists.txt); entered only where latent_attention.cpp's
// expanded_bf16() allows it.
#include "prefill_bf16.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "bf16_rows.hpp"
#include "numeric.hpp"

namespace mla {
namespace {

// R query rows x G groups of 16 keys: R x G accumulators, each pair's G key lines loaded once for
// the R rows (4 x 4: 16 products a pair against 4 loads and 4 broadcasts).
template <int R, int G>
void scores_tile(int64_t pairs, const uint32_t* qp, int64_t ldqp, const uint32_t* kt, float* s, int64_t lds) {
    __m512 acc[R][G];
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
        __m512i k[G];
        for (int g = 0; g < G; ++g) k[g] = _mm512_loadu_si512(kt + (g * pairs + p) * 16);
        for (int r = 0; r < R; ++r) {
            const __m512i q = bcast_dword(qp + r * ldqp + p);
            for (int g = 0; g < G; ++g) acc[r][g] = dp(acc[r][g], q, k[g]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) _mm512_storeu_ps(s + r * lds + 16 * g, acc[r][g]);
}

// R probability rows x CB blocks of 16 output columns, accumulated into o: each row pair's CB
// value lines loaded once for the R rows. mask_last: the last pair's second row counts as zero.
template <int R, int CB>
void wsum_tile(int64_t npairs, bool mask_last, const uint32_t* pp, int64_t ldpp, const uint32_t* vt, int64_t dv,
               float* o, int64_t ldo) {
    __m512 acc[R][CB];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < CB; ++c) acc[r][c] = _mm512_loadu_ps(o + r * ldo + 16 * c);
    const __m512i low = _mm512_set1_epi32(0xFFFF);
    for (int64_t j = 0; j < npairs; ++j) {
        __m512i v[CB];
        for (int c = 0; c < CB; ++c) {
            v[c] = _mm512_loadu_si512(vt + j * dv + 16 * c);
            if (mask_last && j == npairs - 1) v[c] = _mm512_and_si512(v[c], low);
        }
        for (int r = 0; r < R; ++r) {
            const __m512i p = bcast_dword(pp + r * ldpp + j);
            for (int c = 0; c < CB; ++c) acc[r][c] = dp(acc[r][c], p, v[c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < CB; ++c) _mm512_storeu_ps(o + r * ldo + 16 * c, acc[r][c]);
}

using ScoresFn = void (*)(int64_t, const uint32_t*, int64_t, const uint32_t*, float*, int64_t);
using WsumFn = void (*)(int64_t, bool, const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t);
#define MLA_BY4(F, R) {F<R, 1>, F<R, 2>, F<R, 3>, F<R, 4>}
constexpr ScoresFn kScores[4][4] = {MLA_BY4(scores_tile, 1), MLA_BY4(scores_tile, 2), MLA_BY4(scores_tile, 3),
                                    MLA_BY4(scores_tile, 4)};
constexpr WsumFn kWsum[4][4] = {MLA_BY4(wsum_tile, 1), MLA_BY4(wsum_tile, 2), MLA_BY4(wsum_tile, 3),
                                MLA_BY4(wsum_tile, 4)};
#undef MLA_BY4

}  // namespace

void bf16_row_pairs(int64_t m, int64_t w, const float* x, int64_t ldx, uint32_t* xp, int64_t ldxp) {
    for (int64_t i = 0; i < m; ++i) {
        const float* src = x + i * ldx;
        uint32_t* dst = xp + i * ldxp;
        int64_t c = 0;
        for (; c + 32 <= w; c += 32)  // 32 values -> 16 pair dwords
            _mm512_storeu_si512(dst + c / 2, load32_bf16(src, DecodeRowKind::f32, c));
        for (; c < w; c += 2)
            dst[c / 2] = static_cast<uint32_t>(f32_to_bf16(src[c])) | static_cast<uint32_t>(f32_to_bf16(src[c + 1])) << 16;
    }
}

void bf16_key_pairs(int64_t n, int64_t dk, const float* k, int64_t ldk, uint32_t* kt) {
    const int64_t pairs = dk / 2;
    thread_local std::vector<uint32_t> rows;  // a group's 16 keys as pair dwords [16][pairs]
    rows.resize(16 * pairs);
    for (int64_t g = 0; g * 16 < n; ++g) {
        const int64_t keys = std::min<int64_t>(16, n - 16 * g);
        bf16_row_pairs(keys, dk, k + 16 * g * ldk, ldk, rows.data(), pairs);
        std::fill(rows.begin() + keys * pairs, rows.end(), 0u);
        uint32_t* dst = kt + g * pairs * 16;
        for (int64_t p = 0; p < pairs; ++p)
            for (int64_t i = 0; i < 16; ++i) dst[p * 16 + i] = rows[i * pairs + p];
    }
}

void bf16_value_pairs(int64_t n, int64_t dv, const float* v, int64_t rs, int64_t ps, uint32_t* vt) {
    for (int64_t j = 0; 2 * j < n; ++j) {
        const bool second = 2 * j + 1 < n;
        for (int64_t c = 0; c < dv; c += 16) {
            const float* panel = v + (c / 16) * ps;
            const __m512i lo = bf16_dwords(_mm512_loadu_ps(panel + 2 * j * rs));
            const __m512i hi = second ? bf16_dwords(_mm512_loadu_ps(panel + (2 * j + 1) * rs)) : _mm512_setzero_si512();
            _mm512_storeu_si512(vt + j * dv + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

void bf16_scores(int64_t m, int64_t n, int64_t pairs, const uint32_t* qp, int64_t ldqp, const uint32_t* kt, float* s,
                 int64_t lds) {
    const int64_t groups = (n + 15) / 16;  // n <= 64: at most 4
    for (int64_t i = 0; i < m; i += 4) {
        const int64_t rows = std::min<int64_t>(4, m - i);
        kScores[rows - 1][groups - 1](pairs, qp + i * ldqp, ldqp, kt, s + i * lds, lds);
    }
}

void bf16_weighted_sum(int64_t m, int64_t keys, const uint32_t* pp, int64_t ldpp, const uint32_t* vt, int64_t dv,
                       float* o, int64_t ldo) {
    const int64_t npairs = (keys + 1) / 2;
    const bool odd = keys % 2 != 0;
    for (int64_t i = 0; i < m; i += 4) {
        const int64_t rows = std::min<int64_t>(4, m - i);
        for (int64_t c = 0; c < dv; c += 64) {
            const int64_t blocks = std::min<int64_t>(4, (dv - c) / 16);
            kWsum[rows - 1][blocks - 1](npairs, odd, pp + i * ldpp, ldpp, vt + c, dv, o + i * ldo + c, ldo);
        }
    }
}

}  // namespace mla
