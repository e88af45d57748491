// The lightning indexer's scores on AMX bf16 tiles (indexer_amx.hpp). Compiled with -mamx-tile
// -mamx-bf16 -mavx512f/bw/vl/dq -mavx512bf16; entered only when the kernel configuration allows it (kernel_config.hpp: amx_bf16).
#include "indexer_amx.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "amx.hpp"
#include "bf16_rows.hpp"

namespace mla {
namespace {
const TileConfig kConfig;
}  // namespace

bool AmxIndexerScores::fits(int64_t heads, int64_t d) { return heads % 16 == 0 && d % 32 == 0 && d >= 32 && d <= 512; }

void AmxIndexerScores::begin(const float* q, const float* w, int64_t tokens, int64_t heads, int64_t d) {
    tokens_ = tokens, heads_ = heads, d_ = d, groups_ = tokens * heads / 16;
    const int64_t ks = d / 32;
    qt_.resize(groups_ * ks * 512);
    pack_qt_tiles(q, tokens * heads, d, qt_.data());  // Q^T's B tiles (bf16_rows.hpp)
    w_.assign(w, w + tokens * heads);
    kb_.resize(kRows * d);
    st_.resize(4 * 256);
    acc_.resize(tokens * 4 * 16);
    _tile_loadconfig(&kConfig);
}

void AmxIndexerScores::chunk(const void* const* rows, DecodeRowKind kind, int64_t n, float* out, int64_t ldo,
                             const void* const* next, int64_t next_n, int64_t next_bytes) {
    const int64_t d = d_, ks = d / 32, ng = (n + 15) / 16;
    const uint16_t* base[4];
    int64_t stride[4] = {0, 0, 0, 0};
    place_row_groups(rows, kind, n, d, kb_.data(), base, stride);  // bf16_rows.hpp
    float* st = st_.data();
    const int64_t per_token = heads_ / 16;
    // The next chunk's lines, spread over this chunk's (row group, key group) steps.
    const int64_t row_lines = (next_bytes + 63) / 64, lines = next_n * row_lines;
    const int64_t steps = ((groups_ + 3) / 4) * ng;
    const int64_t per_group = (lines + steps - 1) / steps;
    int64_t pr = 0, pl = 0;
    // Per (token, key group) accumulators of the weighted relu sums, 16 keys in the lanes.
    float* acc = acc_.data();
    std::fill(acc, acc + tokens_ * 4 * 16, 0.f);
    const __m512 zero = _mm512_setzero_ps();
    // Four query-row groups at a time (tiles 0-3), each key tile (4) loaded once for them: a key
    // tile comes from memory, the Q^T tiles (5, 6) from L1.
    for (int64_t g0 = 0; g0 < groups_; g0 += 4) {
        const int64_t gn = std::min<int64_t>(4, groups_ - g0);
        const uint16_t* qt = qt_.data() + g0 * ks * 512;
        for (int64_t b = 0; b < ng; ++b) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t s = 0; s < ks; ++s) {
                _tile_loadd(4, base[b] + 32 * s, stride[b]);
                _tile_loadd(5, qt + s * 512, 64);
                _tile_dpbf16ps(0, 4, 5);
                if (gn > 1) {
                    _tile_loadd(6, qt + (ks + s) * 512, 64);
                    _tile_dpbf16ps(1, 4, 6);
                }
                if (gn > 2) {
                    _tile_loadd(7, qt + (2 * ks + s) * 512, 64);
                    _tile_dpbf16ps(2, 4, 7);
                }
                if (gn > 3) {
                    _tile_loadd(5, qt + (3 * ks + s) * 512, 64);
                    _tile_dpbf16ps(3, 4, 5);
                }
            }
            _tile_stored(0, st + 0 * 256, 64);
            if (gn > 1) _tile_stored(1, st + 1 * 256, 64);
            if (gn > 2) _tile_stored(2, st + 2 * 256, 64);
            if (gn > 3) _tile_stored(3, st + 3 * 256, 64);
            for (int64_t k = per_group; k > 0 && pr < next_n; --k) {
                _mm_prefetch(static_cast<const char*>(next[pr]) + 64 * pl, _MM_HINT_T0);
                if (++pl == row_lines) pl = 0, ++pr;
            }
            // Each [16 keys x 16 query rows] block transposed back to [16 heads x 16 keys]:
            // acc(token, b) += w[h] * relu(row h).
            for (int64_t i = 0; i < gn; ++i) {
                const int64_t g = g0 + i;
                __m512 blk[16];
                for (int j = 0; j < 16; ++j) blk[j] = _mm512_loadu_ps(st + 256 * i + 16 * j);
                transpose16(blk);
                const float* wg = w_.data() + 16 * g;
                float* a = acc + ((g / per_token) * 4 + b) * 16;
                __m512 sum = _mm512_loadu_ps(a);
                for (int h = 0; h < 16; ++h) sum = _mm512_fmadd_ps(_mm512_set1_ps(wg[h]), _mm512_max_ps(blk[h], zero), sum);
                _mm512_storeu_ps(a, sum);
            }
        }
    }
    for (int64_t t = 0; t < tokens_; ++t)
        for (int64_t b = 0; b < ng; ++b) {
            const int64_t valid = std::min<int64_t>(16, n - 16 * b);
            _mm512_mask_storeu_ps(out + t * ldo + 16 * b, static_cast<__mmask16>((1u << valid) - 1),
                                  _mm512_loadu_ps(acc + (t * 4 + b) * 16));
        }
}

void AmxIndexerScores::end() { _tile_release(); }

}  // namespace mla
