// AVX512-BF16 vector dot products for the absorbed decode rows (see attention_bf16.hpp). Compiled
// with -mavx512f/bw/vl/dq -mavx512bf16 (CMakeLists.txt); entered only where the kernel
// configuration's decode_rows engine allows it (kernel_config.hpp).
#include "attention_bf16.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "bf16_rows.hpp"

namespace mla {
namespace {

inline __m512i bcast_pair(const uint16_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// The row pairs of V interleave two rows' 32-column groups with unpacklo/hi_epi16, which work
// within 128-bit lanes: dword d of a group (d < 16 from unpacklo, then unpackhi) holds column
// kColumn[d] of both rows. Outputs accumulate in that order; end() puts them back.
// kColumn = {0-3, 8-11, 16-19, 24-27, 4-7, 12-15, 20-23, 28-31}.

constexpr int kKeys = 16;  // cache rows a score tile: 16 accumulators, one Q^T load per pair
constexpr int kCols = 16;  // output columns a P . V tile: 16 accumulators, one P^T load per row pair

// One score tile of 16 rows that lie `stride` elements apart from `base` (STRIDE: the same, known
// at compile time, so the 16 broadcasts address one register plus constant offsets; 0: runtime).
// Sixteen separate row pointers do not fit the general registers beside the loop's own: the
// compiler spilled them and reloaded one every few dot products (the tile ran at ~60% of the
// vdpbf16ps peak on Zen 4). pf: the next chunk's lines, issued one every `every` pairs.
template <int64_t STRIDE, class Prefetch>
inline void score_tile(const uint32_t* qt, int64_t pairs, const uint16_t* base, int64_t stride, __m512* acc,
                       Prefetch& pf, int64_t every) {
    const int64_t s = STRIDE ? STRIDE : stride;
    for (int64_t p = 0; p < pairs; ++p) {
        const __m512i qv = _mm512_load_si512(qt + p * 16);
        const uint16_t* at = base + 2 * p;
#pragma GCC unroll 16
        for (int k = 0; k < kKeys; ++k) acc[k] = dp(acc[k], qv, bcast_pair(at + k * s));
        if (every && p % every == 0) pf(1);
    }
}

}  // namespace

void Bf16DecodeRows::begin(const float* q, int64_t m, int64_t w, int64_t r) {
    m_ = m, w_ = w, r_ = r, groups_ = (m + 15) / 16;
    // Q^T pairs: for group g and input pair p, dword i = head 16g + i's bf16 inputs 2p (low half)
    // and 2p + 1 (high); heads past m zero (they score 0 and are dropped). That is the AMX
    // engine's B tiles laid end to end (pack_qt_tiles: 16 x 16 transposes of the rows' pairs).
    qt_.resize(groups_ * (w / 2) * 32);
    pack_qt_tiles(q, m, w, qt_.data());
    kb_.resize(kRows * w);
    vp_.resize(kRows / 2 * r);
    pp_.resize(kRows / 2 * 16);
    st_.resize(kRows * 16);
    ot_.assign(groups_ * r * 16, 0.f);
    mx_.assign(groups_ * 16, -std::numeric_limits<float>::infinity());
    l_.assign(groups_ * 16, 0.f);
}

// One chunk: the rows in bf16 (read in place when they are), V's row pairs, then per group of 16
// heads the scores S^T (a vector of 16 heads per row), the online softmax, and O^T += P . V.
void Bf16DecodeRows::chunk(const void* const* rows, Rows kind, int64_t n, float scale, const void* const* next,
                           int64_t next_n) {
    const int64_t w = w_, r = r_, pairs = w / 2, np = (n + 1) / 2;
    const uint16_t* row16[kRows];
    for (int64_t j = 0; j < n; ++j) {
        if (kind == Rows::bf16) {
            row16[j] = static_cast<const uint16_t*>(rows[j]);
            continue;
        }
        uint16_t* dst = kb_.data() + j * w;
        for (int64_t c = 0; c < w; c += 32) _mm512_storeu_si512(dst + c, load32_bf16(rows[j], kind, c));
        row16[j] = dst;
    }
    // V's row pairs: dword d of pair jp's 32-column group c holds column c + kColumn[d] of rows 2jp
    // (low half) and 2jp + 1 (high); an odd last row pairs with zeros (its partner's probability is
    // 0, and 0 x NaN would still poison the sum).
    for (int64_t jp = 0; jp < np; ++jp) {
        const uint16_t* a = row16[2 * jp];
        const uint16_t* b = 2 * jp + 1 < n ? row16[2 * jp + 1] : nullptr;
        uint32_t* dst = vp_.data() + jp * r;
        for (int64_t c = 0; c < r; c += 32) {
            const __m512i va = _mm512_loadu_si512(a + c);
            const __m512i vb = b ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
            _mm512_storeu_si512(dst + c, _mm512_unpacklo_epi16(va, vb));
            _mm512_storeu_si512(dst + c + 16, _mm512_unpackhi_epi16(va, vb));
        }
    }
    // The next chunk's rows toward L2, spread over the first group's score tiles.
    const int64_t row_lines = (w * (kind == Rows::f32 ? 4 : 2) + 63) / 64, lines = next_n * row_lines;
    const int64_t tiles = (n + kKeys - 1) / kKeys, per_tile = (lines + tiles - 1) / tiles;
    const int64_t step = std::max<int64_t>(1, pairs / std::max<int64_t>(1, per_tile));
    int64_t pr = 0, pl = 0;
    const auto prefetch = [&](int64_t k) {
        for (; k > 0 && pr < next_n; --k) {
            _mm_prefetch(static_cast<const char*>(next[pr]) + 64 * pl, _MM_HINT_T1);
            if (++pl == row_lines) pl = 0, ++pr;
        }
    };
    const __m512 vscale = _mm512_set1_ps(scale);
    float* st = st_.data();
    for (int64_t g = 0; g < groups_; ++g) {
        const uint32_t* qt = reinterpret_cast<const uint32_t*>(qt_.data() + g * pairs * 32);
        // S^T: st[j] = the 16 heads' scores against row j.
        for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
            const int64_t nk = std::min<int64_t>(kKeys, n - j0);
            __m512 acc[kKeys];
            for (int k = 0; k < kKeys; ++k) acc[k] = _mm512_setzero_ps();
            // Rows evenly spaced (converted rows in kb_, or a cache block's 16 rows side by side).
            const uint16_t* base = row16[j0];
            bool spaced = nk == kKeys;
            for (int k = 1; spaced && k < kKeys; ++k) spaced = row16[j0 + k] == base + k * w;
            const int64_t every = g == 0 && pr < next_n ? step : 0;
            if (spaced && w == 576)  // DeepSeek's (and Kimi's, GLM's) latent 512 + rope 64
                score_tile<576>(qt, pairs, base, w, acc, prefetch, every);
            else if (spaced)
                score_tile<0>(qt, pairs, base, w, acc, prefetch, every);
            else if (nk == kKeys) {
                for (int64_t p = 0; p < pairs; ++p) {
                    const __m512i qv = _mm512_load_si512(qt + p * 16);
                    for (int k = 0; k < kKeys; ++k) acc[k] = dp(acc[k], qv, bcast_pair(row16[j0 + k] + 2 * p));
                }
            } else {
                for (int64_t p = 0; p < pairs; ++p) {
                    const __m512i qv = _mm512_load_si512(qt + p * 16);
                    for (int k = 0; k < nk; ++k) acc[k] = dp(acc[k], qv, bcast_pair(row16[j0 + k] + 2 * p));
                }
            }
            for (int k = 0; k < nk; ++k) _mm512_store_ps(st + 16 * (j0 + k), _mm512_mul_ps(acc[k], vscale));
            // Catch up to this tile's share (all of it at the last tile): the spaced tiles issued
            // theirs as they went, the others issue it here.
            if (g == 0) prefetch(std::min(lines, (j0 / kKeys + 1) * per_tile) - (pr * row_lines + pl));
        }
        // Online softmax with the 16 heads in the lanes.
        float* mxg = mx_.data() + 16 * g;
        float* lg = l_.data() + 16 * g;
        __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j < n; ++j) vmax = _mm512_max_ps(vmax, _mm512_load_ps(st + 16 * j));
        const __m512 mold = _mm512_loadu_ps(mxg), mnew = _mm512_max_ps(mold, vmax);
        const __m512 alpha = exp_neg(_mm512_sub_ps(mold, mnew));  // 0 on the first chunk (-inf - m)
        __m512 sum = _mm512_setzero_ps();
        uint32_t* pp = pp_.data();
        for (int64_t jp = 0; jp < np; ++jp) {
            const __m512 e0 = exp_neg(_mm512_sub_ps(_mm512_load_ps(st + 32 * jp), mnew));
            const __m512 e1 = 2 * jp + 1 < n ? exp_neg(_mm512_sub_ps(_mm512_load_ps(st + 32 * jp + 16), mnew))
                                             : _mm512_setzero_ps();
            sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
            // P^T pair: dword i = head i's probabilities of rows 2jp (low) and 2jp + 1 (high)
            _mm512_store_si512(pp + 16 * jp, _mm512_or_si512(bf16_dwords(e0), _mm512_slli_epi32(bf16_dwords(e1), 16)));
        }
        _mm512_storeu_ps(lg, _mm512_fmadd_ps(_mm512_loadu_ps(lg), alpha, sum));
        _mm512_storeu_ps(mxg, mnew);
        // O^T = alpha O^T + P . V, kCols output columns a tile over every row pair.
        float* og = ot_.data() + g * r * 16;
        for (int64_t c0 = 0; c0 < r; c0 += kCols) {
            __m512 acc[kCols];
            for (int k = 0; k < kCols; ++k) acc[k] = _mm512_mul_ps(_mm512_load_ps(og + (c0 + k) * 16), alpha);
            for (int64_t jp = 0; jp < np; ++jp) {
                const __m512i pv = _mm512_load_si512(pp + 16 * jp);
                const uint32_t* v = vp_.data() + jp * r + c0;
                for (int k = 0; k < kCols; ++k) acc[k] = dp(acc[k], pv, bcast_dword(v + k));
            }
            for (int k = 0; k < kCols; ++k) _mm512_store_ps(og + (c0 + k) * 16, acc[k]);
        }
    }
}

void Bf16DecodeRows::end(float* mx, float* l, float* o, int64_t ldo) {
    // O^T's 32-column groups back to rows: positions d < 16 of a group hold columns kColumn[d] =
    // 0-3, 8-11, 16-19, 24-27 and d >= 16 the others, so after a 16 x 16 transpose of each half a
    // head's two vectors interleave by 128-bit lanes into columns 0-15 and 16-31.
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t g = 0; g < groups_; ++g) {
        const int64_t heads = std::min<int64_t>(16, m_ - 16 * g);
        const float* og = ot_.data() + g * r_ * 16;
        for (int64_t c = 0; c < r_; c += 32) {
            __m512 lo[16], hi[16];
            for (int d = 0; d < 16; ++d) {
                lo[d] = _mm512_load_ps(og + (c + d) * 16);
                hi[d] = _mm512_load_ps(og + (c + 16 + d) * 16);
            }
            transpose16(lo);
            transpose16(hi);
            for (int64_t i = 0; i < heads; ++i) {
                float* dst = o + (16 * g + i) * ldo + c;
                _mm512_storeu_ps(dst, _mm512_permutex2var_ps(lo[i], first, hi[i]));
                _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(lo[i], second, hi[i]));
            }
        }
    }
    std::copy_n(mx_.data(), m_, mx);
    std::copy_n(l_.data(), m_, l);
}

}  // namespace mla
