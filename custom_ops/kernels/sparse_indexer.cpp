// MlaIndexerTopK: DeepSeek Sparse Attention's lightning indexer over the paged indexer-key cache.
//
// For new token t of a sequence (at position p, seeing positions 0..p):
//   score[t, s] = sum_h weights[t, h] * relu(q[t, h] . key[s])      for s <= p
// and the output lists the topk positions of largest score (ascending; -1 pads a token that sees
// fewer than topk positions, which then lists all of them). transformers' DeepseekV32Indexer
// multiplies by the softmax scale inside the relu and by n_heads^-0.5 after: both are positive,
// so the graph folds them into `weights`.
//
// Tokens that score are taken in tiles of kTile consecutive tokens: the tile's q rows (kTile x
// heads) share each chunk of kChunk gathered keys in one row_dot, and each token's scores over
// its context live in a [kTile, context] buffer that is reduced to its top-k before the next tile
// (so a long prefill never holds [T, context] scores). With fewer tiles than threads (decode)
// one tile's context is split across the threads instead.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "kernel_config.hpp"
#include "mla_kernels.hpp"
#if defined(MLA_HAVE_AMX)
#include "amx.hpp"
#include "indexer_amx.hpp"
#endif
#include "numeric.hpp"
#include "validate.hpp"

namespace mla {
namespace {

const char* const kOp = "MlaIndexerTopK";
constexpr int64_t kChunk = 64;  // context positions scored per row_dot
constexpr int64_t kTile = 8;    // query tokens sharing each chunk

struct Tile {
    int64_t b, t0, n, past;  // tokens t0 .. t0 + n of sequence b; token t sits at position past + t - start
    int64_t start;
    int64_t limit(int64_t i) const { return past + (t0 + i - start) + 1; }  // positions token t0 + i sees
};

struct Scratch {
    std::vector<float> keys, s, acc, scores;
    std::vector<uint64_t> order;
    template <typename T>
    static T* get(std::vector<T>& v, int64_t n) {
        if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
        return v.data();
    }
};
thread_local Scratch tls;
#if defined(MLA_HAVE_AMX)
thread_local AmxIndexerScores tls_amx;
#endif

// Whether this call's scores take AMX bf16 tiles (compute "bf16" on a CPU with AMX-BF16).
bool amx_scores(const IndexerPlan& p) {
#if defined(MLA_HAVE_AMX)
    return p.bf16_products && AmxIndexerScores::fits(p.heads, p.dim) && kernels().amx_bf16;
#else
    (void)p;
    return false;
#endif
}

// score_tile's chunks on AMX tiles: the same scores with bf16 products and f32 sums.
void score_tile_amx(const IsaKernels& K, const IndexerPlan& p, const Tile& tile, const float* q, const float* w,
                    int64_t c_begin, int64_t c_end, float* scores, int64_t ld) {
#if defined(MLA_HAVE_AMX)
    const int64_t hi = p.heads, d = p.dim, bs = p.cache.logical.dim(1), m_bt = p.block_tables->dim(1);
    const bool direct = !p.cache.quantised;  // float rows in place; quantised ones widened first
    const DecodeRowKind rows_kind = direct ? p.cache.float_kind() : DecodeRowKind::f32;
    float* kr = direct ? nullptr : Scratch::get(tls.keys, kChunk * d);
    float* out = Scratch::get(tls.acc, tile.n * kChunk);
    const void* at[2][kChunk];  // this chunk's rows and the next one's
    const void* rows[kChunk];
    const auto gather = [&](int64_t c0, const void** dst) {
        const int64_t n = std::min(kChunk, c_end - c0);
        for (int64_t j = 0; j < n; ++j) {
            const int64_t pos = c0 + j;
            dst[j] = p.cache.row(index_at(*p.block_tables, tile.b * m_bt + pos / bs), pos % bs);
        }
        return n;
    };
    AmxIndexerScores& eng = tls_amx;
    eng.begin(q + tile.t0 * hi * d, w + tile.t0 * hi, tile.n, hi, d);
    if (c_begin < c_end) gather(c_begin, at[0]);
    for (int64_t c0 = c_begin, cur = 0; c0 < c_end; c0 += kChunk, cur ^= 1) {
        const int64_t n = std::min(kChunk, c_end - c0);
        const void** src = at[cur];
        const int64_t next_n = c0 + kChunk < c_end ? gather(c0 + kChunk, at[cur ^ 1]) : 0;
        if (direct) {
            std::copy_n(src, n, rows);
        } else {
            K.load_rows(p.cache.format, src, n, kr, d);
            for (int64_t j = 0; j < n; ++j) rows[j] = kr + j * d;
        }
        eng.chunk(rows, rows_kind, n, out, kChunk, at[cur ^ 1], next_n, p.cache.row_bytes);
        for (int64_t i = 0; i < tile.n; ++i) {
            const int64_t vis = std::min(n, tile.limit(i) - c0);
            if (vis > 0) std::copy_n(out + i * kChunk, vis, scores + i * ld + c0);
        }
    }
    eng.end();
#else
    (void)K, (void)p, (void)tile, (void)q, (void)w, (void)c_begin, (void)c_end, (void)scores, (void)ld;
#endif
}

// Scores of the tile's tokens at positions [c_begin, c_end) into scores[i * ld + position].
void score_tile(const IsaKernels& K, const IndexerPlan& p, const Tile& tile, const float* q, const float* w,
                int64_t c_begin, int64_t c_end, float* scores, int64_t ld) {
    if (amx_scores(p)) return score_tile_amx(K, p, tile, q, w, c_begin, c_end, scores, ld);
    const int64_t hi = p.heads, d = p.dim, m = tile.n * hi, bs = p.cache.logical.dim(1);
    const int64_t m_bt = p.block_tables->dim(1);
    const float* qt = q + tile.t0 * hi * d;
    float* s = Scratch::get(tls.s, m * kChunk);
    float* acc = Scratch::get(tls.acc, kChunk);
    const bool direct = p.cache.in_place();
    float* kr = direct ? nullptr : Scratch::get(tls.keys, kChunk * d);
    const void* src[kChunk];
    const float* rows[kChunk];
    for (int64_t c0 = c_begin; c0 < c_end; c0 += kChunk) {
        const int64_t n = std::min(kChunk, c_end - c0);
        for (int64_t j = 0; j < n; ++j) {
            const int64_t pos = c0 + j;
            src[j] = p.cache.row(index_at(*p.block_tables, tile.b * m_bt + pos / bs), pos % bs);
        }
        if (direct) {
            for (int64_t j = 0; j < n; ++j) rows[j] = static_cast<const float*>(src[j]);
        } else {
            K.load_rows(p.cache.format, src, n, kr, d);
            for (int64_t j = 0; j < n; ++j) rows[j] = kr + j * d;
        }
        // Rows of tokens that see nothing of this chunk are skipped (tokens are in position order).
        int64_t first = 0;
        while (first < tile.n && tile.limit(first) <= c0) ++first;
        if (first == tile.n) break;
        K.row_dot((tile.n - first) * hi, n, d, qt + first * hi * d, d, rows, s + first * hi * kChunk, kChunk, nullptr);
        for (int64_t i = first; i < tile.n; ++i) {
            const int64_t vis = std::min(n, tile.limit(i) - c0);
            std::fill(acc, acc + vis, 0.f);
            const float* wt = w + (tile.t0 + i) * hi;
            for (int64_t h = 0; h < hi; ++h) {
                const float* sr = s + (i * hi + h) * kChunk;
                const float wh = wt[h];
                for (int64_t j = 0; j < vis; ++j) acc[j] += wh * std::max(sr[j], 0.f);
            }
            std::copy_n(acc, vis, scores + i * ld + c0);
        }
    }
}

// The topk largest of scores[0 .. limit) (limit > topk) as ascending positions into out. Ties go to
// the earlier position; a NaN score counts as the largest, so a poisoned key is selected and its
// NaN reaches the attention's output (loud) instead of being dropped silently. Each candidate is
// one 64-bit key, (the score's bits in an order-preserving form) << 32 | ~position, so the
// selection compares plain integers in one array (an index array compared through the scores,
// as before, made every comparison two dependent loads: 64k positions 2-3x slower).
void select_topk(const float* scores, int64_t limit, int64_t topk, int32_t* out) {
    uint64_t* keys = Scratch::get(tls.order, limit);
    for (int64_t j = 0; j < limit; ++j) {
        uint32_t bits;
        std::memcpy(&bits, &scores[j], 4);
        // Flip negatives wholly and set the sign of positives: unsigned order = float order.
        uint32_t ord = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
        if (std::isnan(scores[j])) ord = 0xffffffffu;
        keys[j] = (uint64_t(ord) << 32) | (0xffffffffu - static_cast<uint32_t>(j));
    }
    std::nth_element(keys, keys + topk - 1, keys + limit, std::greater<uint64_t>());
    for (int64_t j = 0; j < topk; ++j) out[j] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(keys[j]));
    std::sort(out, out + topk);
}

}  // namespace

IndexerPlan plan_indexer(const TensorView& q, const TensorView& weights, const TensorView& cache_in,
                         const TensorView& qsl, const TensorView& seq_lens, const TensorView& bt, int64_t topk,
                         KvDtype kv_dtype) {
    check_rank(kOp, q, 3);
    check_float(kOp, q);
    check_rank(kOp, weights, 2);
    check_float(kOp, weights);
    const int64_t t_count = q.dim(0), heads = q.dim(1), d = q.dim(2);
    if (heads < 1 || d < 1) fail(kOp, q, "must have at least one head and one value, got shape " + shape_str(q.shape));
    check_dim(kOp, weights, 0, t_count, "the number of tokens T of q");
    check_dim(kOp, weights, 1, heads, "the number of indexer heads of q");
    if (topk < 1) throw Error(std::string(kOp) + ": attribute 'topk' must be >= 1, got " + std::to_string(topk));
    const CacheRows rows = cache_rows(kOp, cache_in, kv_dtype, d, /*writable=*/false);
    if (rows.width != d)
        fail(kOp, cache_in, "must hold keys of " + std::to_string(d) + " values (the head dim of q), got rows of " +
                                std::to_string(rows.width));
    check_new_tokens(kOp, qsl, seq_lens, bt, rows.logical, t_count, "q");
    return IndexerPlan{t_count, heads, d, topk, rows, &q, &weights, &qsl, &seq_lens, &bt};
}

void run_indexer(const IndexerPlan& p, const TensorView& out, const Threading& th, Workspace& ws) {
    const IsaKernels& K = isa();
    const int64_t hi = p.heads, d = p.dim, k = p.topk, batch = p.query_start_loc->dim(0) - 1;
    int32_t* o = out.ptr<int32_t>();
    // f32 copies of q and weights only when they come in another float type.
    const float* q = p.q->ptr<const float>();
    const float* w = p.weights->ptr<const float>();
    if (p.q->dtype != DType::f32) {
        ws.index_q.resize(static_cast<size_t>(p.tokens * hi * d));
        to_f32(p.q->data, p.q->dtype, ws.index_q.data(), p.tokens * hi * d);
        q = ws.index_q.data();
    }
    if (p.weights->dtype != DType::f32) {
        ws.index_w.resize(static_cast<size_t>(p.tokens * hi));
        to_f32(p.weights->data, p.weights->dtype, ws.index_w.data(), p.tokens * hi);
        w = ws.index_w.data();
    }
    // Tokens that see at most topk positions list them all; the others are scored in tiles.
    std::vector<Tile> tiles;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t start = index_at(*p.query_start_loc, b), qlen = index_at(*p.query_start_loc, b + 1) - start;
        const int64_t past = index_at(*p.seq_lens, b) - qlen;
        int64_t t = start;
        for (; t < start + qlen && past + (t - start) + 1 <= k; ++t) {
            const int64_t limit = past + (t - start) + 1;
            for (int64_t j = 0; j < k; ++j) o[t * k + j] = j < limit ? static_cast<int32_t>(j) : -1;
        }
        for (; t < start + qlen; t += kTile) tiles.push_back(Tile{b, t, std::min(kTile, start + qlen - t), past, start});
    }
    if (tiles.empty()) return;
    const int64_t n_tiles = static_cast<int64_t>(tiles.size());
    if (n_tiles >= th.num_threads) {
        // Largest contexts first: each task scores a whole tile and reduces it.
        std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) {
            return a.limit(a.n - 1) > b.limit(b.n - 1);
        });
        dynamic_for(th, n_tiles, [&](int64_t i) {
            const Tile& tile = tiles[i];
            const int64_t ld = tile.limit(tile.n - 1);
            float* scores = Scratch::get(tls.scores, tile.n * ld);
            score_tile(K, p, tile, q, w, 0, ld, scores, ld);
            for (int64_t j = 0; j < tile.n; ++j) select_topk(scores + j * ld, tile.limit(j), k, o + (tile.t0 + j) * k);
        });
        return;
    }
    // Few tiles (decode): each tile's context is split across the threads, then its tokens reduced in parallel.
    for (const Tile& tile : tiles) {
        const int64_t ld = tile.limit(tile.n - 1);
        ws.index_scores.resize(static_cast<size_t>(std::max<int64_t>(tile.n * ld, 1)));
        float* scores = ws.index_scores.data();
        const int64_t chunks = (ld + kChunk - 1) / kChunk;
        const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(chunks, 4 * th.num_threads));
        dynamic_for(th, parts, [&](int64_t i) {
            const int64_t c0 = chunks * i / parts * kChunk, c1 = std::min(ld, chunks * (i + 1) / parts * kChunk);
            score_tile(K, p, tile, q, w, c0, c1, scores, ld);
        });
        dynamic_for(th, tile.n, [&](int64_t j) {
            select_topk(scores + j * ld, tile.limit(j), k, o + (tile.t0 + j) * k);
        });
    }
}

}  // namespace mla
