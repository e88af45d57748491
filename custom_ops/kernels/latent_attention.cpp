// MlaPagedAttention (decode is its one-token-per-sequence call).
//
// Both walk a sequence's context in chunks of kChunk positions gathered from the paged cache
// (any block size), keep an online softmax per query row (flash-attention style), and split
// long contexts across threads, merging the partial results by log-sum-exp.
//
// Absorbed form (decode and short extends): query rows are [q_nope @ W_UK | q_pe] (W wide) for
// every (token, head); scores = rows . cache rows; the latent output (first r columns) is
// up-projected by W_UV at the end. All heads of a sequence share each gathered cache chunk.
// Expanded form (long prefills): per head, the chunk's latent rows are up-projected once to
// K_nope = W_UK kv_c and V = kv_c W_UV, then ordinary causal attention with 192/128-wide dots
// (AVX512-BF16 dots under compute "bf16": prefill_bf16.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_features.hpp"
#include "kernel_config.hpp"
#include "mla_kernels.hpp"
#if defined(MLA_HAVE_AMX)
#include "amx.hpp"
#include "attention_amx.hpp"
#endif
#include "attention_bf16.hpp"
#include "numeric.hpp"
#include "prefill_bf16.hpp"
#include "validate.hpp"

namespace mla {
namespace {

constexpr int64_t kChunk = 64;  // context positions per online-softmax step
constexpr int64_t kMergeRows = 8;  // query rows a task when a sequence's context splits merge
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One sequence's rows of the paged cache. Under sparse attention (a top-k index list per token)
// a token's "context" is its list: position i of the walk is the cached position positions[i].
struct SeqCache {
    const CacheRows* rows;  // the format: f32 rows are read in place, others widened by load_rows
    int64_t bs, width;
    const TensorView* block_tables;
    int64_t table_offset;  // b * M
    const int32_t* positions = nullptr;  // sparse: the selected positions, ascending

    const void* row(int64_t pos) const {
        if (positions) pos = positions[pos];
        const int64_t blk = index_at(*block_tables, table_offset + pos / bs);
        return rows->row(blk, pos % bs);
    }
    bool in_place() const { return rows->in_place(); }
};

SeqCache seq_cache(const CacheRows& cache, const TensorView& bt, int64_t b) {
    return SeqCache{&cache, cache.logical.dim(1), cache.width, &bt, b * bt.dim(1)};
}

// Per-thread scratch, grown on demand and reused across calls.
struct Scratch {
    std::vector<float> kr, s, krow, v, qh, wk, wv;
    // expanded_task's bf16 products (prefill_bf16.hpp): query, key, value, probability, latent and
    // the head's two weights' pairs
    std::vector<uint32_t> qpairs, kpairs, vpairs, ppairs, lpairs, wkpairs, wvpairs;
    std::vector<int64_t> cursor;  // expanded_sparse_task: each token's next selected position
    template <class T>
    static T* get(std::vector<T>& buf, int64_t n) {
        if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
        return buf.data();
    }
};
thread_local Scratch tls;

// Gathers positions [c0, c0 + n) (n <= kChunk) as contiguous f32 rows kr [n, W] (widening /
// dequantising in the ISA table's chunk-level entry).
void gather_chunk(const IsaKernels& K, const SeqCache& sc, int64_t c0, int64_t n, float* kr) {
    const void* src[kChunk];
    for (int64_t j = 0; j < n; ++j) src[j] = sc.row(c0 + j);
    K.load_rows(sc.rows->format, src, n, kr, sc.width);
}

// Packs B[p, j] = src[p * sp + j * sj] (p < k, j < n) into 16-column panels of k rows for
// gemm_packed, zero-filling the last panel's columns past n.
void pack_panels(const float* src, int64_t sp, int64_t sj, int64_t k, int64_t n, float* dst) {
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        float* panel = dst + (j0 / 16) * k * 16;
        const int64_t nr = std::min<int64_t>(16, n - j0);
        for (int64_t p = 0; p < k; ++p) {
            for (int64_t j = 0; j < nr; ++j) panel[p * 16 + j] = src[p * sp + (j0 + j) * sj];
            for (int64_t j = nr; j < 16; ++j) panel[p * 16 + j] = 0.f;
        }
    }
}

// Online softmax over one chunk for rows [0, rows) of s (row stride kChunk, already holding raw
// scores); row i sees the first visible(i) columns of the chunk. Rescales o (row stride ldo, width
// dv) by the change of the running max and leaves the chunk's probabilities in s.
template <typename Visible>
void softmax_step(const IsaKernels& K, float* s, int64_t rows, float scale, Visible visible,
                  float* mx, float* l, float* o, int64_t ldo, int64_t dv) {
    for (int64_t i = 0; i < rows; ++i) {
        float* row = s + i * kChunk;
        const int64_t v = visible(i);
        const float cmax = K.scale_max(row, v, scale);
        for (int64_t j = v; j < kChunk; ++j) row[j] = kNegInf;
        if (v == 0) {  // nothing visible: contributes nothing, state unchanged
            for (int64_t j = 0; j < kChunk; ++j) row[j] = 0.f;
            continue;
        }
        const float m_new = std::max(mx[i], cmax);
        const float alpha = std::exp(mx[i] - m_new);  // 0 on the first visible chunk
        const float sum = K.exp_sum(row, kChunk, m_new);
        l[i] = l[i] * alpha + sum;
        mx[i] = m_new;
        if (alpha != 1.f) {
            float* orow = o + i * ldo;
            for (int64_t d = 0; d < dv; ++d) orow[d] *= alpha;
        }
    }
}

// ---------------------------------------------------------------- absorbed form

// One sequence in the absorbed form: rows = qlen * H query rows of width W, [q_nope W_UK | q_pe] (row t * H + h).
struct AbsorbedSeq {
    SeqCache cache;
    const float* q;  // [rows, W]
    int64_t qlen, heads, seq_len;
    float* out_lat;  // [rows, r]: softmax(q . rows) @ rows[:, :r]
};

struct Partial {  // online-softmax state of one (sequence, context split) task
    int64_t seq, c_begin, c_end;
    float *mx, *l, *o;
};

// Positions visible to row i (token i / H) of a sequence: those < seq_len - qlen + t + 1.
inline int64_t row_limit(const AbsorbedSeq& s, int64_t i) { return s.seq_len - s.qlen + i / s.heads + 1; }

void absorbed_task(const IsaKernels& K, const AbsorbedSeq& s, const Partial& p, int64_t r, float scale) {
    const int64_t rows = s.qlen * s.heads, w = s.cache.width;
    float* sbuf = Scratch::get(tls.s, rows * kChunk);
    float* kr = Scratch::get(tls.kr, kChunk * w);
    std::fill(p.mx, p.mx + rows, kNegInf);
    std::fill(p.l, p.l + rows, 0.f);
    std::fill(p.o, p.o + rows * r, 0.f);
    const float* chunk_rows[kChunk];
    const int64_t row_bytes = s.cache.rows->row_bytes;
    for (int64_t c0 = p.c_begin; c0 < p.c_end; c0 += kChunk) {
        const int64_t n = std::min(kChunk, p.c_end - c0);
        // Rows are ordered by token, so by limit: skip the leading rows that see nothing here.
        const int64_t t0 = std::max<int64_t>(0, c0 - (s.seq_len - s.qlen));
        const int64_t i0 = t0 * s.heads;
        if (i0 >= rows) break;
        // f32 rows are read where they live (prefetched by the previous chunk's tiles); other
        // formats are widened (dequantised) once into f32 scratch shared by every head and both
        // products (widening in every tile that reads a row was slower).
        if (s.cache.in_place()) {
            for (int64_t j = 0; j < n; ++j) chunk_rows[j] = static_cast<const float*>(s.cache.row(c0 + j));
        } else {
            gather_chunk(K, s.cache, c0, n, kr);
            for (int64_t j = 0; j < n; ++j) chunk_rows[j] = kr + j * w;
        }
        // The next chunk's rows are pulled toward the core by the tiles of this one.
        PrefetchStream pf;
        const int64_t next = std::min(kChunk, p.c_end - c0 - kChunk);
        for (int64_t j = 0; j < next; ++j) pf.add(s.cache.row(c0 + kChunk + j), row_bytes);
        const int64_t m = rows - i0, tiles = std::max<int64_t>(1, dot_axpy_tiles(K, m, n, r));
        pf.per_tile = static_cast<int>((pf.lines() + tiles - 1) / tiles);
        K.row_dot(m, n, w, s.q + i0 * w, w, chunk_rows, sbuf, kChunk, &pf);
        auto visible = [&](int64_t i) { return std::clamp<int64_t>(row_limit(s, i0 + i) - c0, 0, n); };
        softmax_step(K, sbuf, m, scale, visible, p.mx + i0, p.l + i0, p.o + i0 * r, r, r);
        // Each row sums only the rows it may see: a row past its causal limit is never read into
        // the sum (its weight is 0, but 0 x NaN/Inf would still poison the output). Rows are
        // ordered by token, so equal limits form runs; only the chunk on the diagonal has more
        // than one run.
        for (int64_t a = 0; a < m;) {
            const int64_t v = visible(a);
            int64_t e = a + 1;
            while (e < m && visible(e) == v) ++e;
            if (v > 0)
                K.row_axpy(e - a, v, r, sbuf + a * kChunk, kChunk, chunk_rows, p.o + (i0 + a) * r, r,
                           v == n ? &pf : nullptr);
            a = e;
        }
        pf.issue(1 << 30);  // whatever the tiles did not cover
    }
}

// absorbed_task for a single-token sequence on bf16 products (compute "bf16" only): every row
// sees every position of the part, so each chunk is one pass for all heads. Rows: an engine with
// attention_amx.hpp's interface (AmxDecodeRows on AMX tiles, Bf16DecodeRows on AVX512-BF16 dots).
template <class Engine>
void absorbed_task_rows(const IsaKernels& K, const AbsorbedSeq& s, const Partial& p, int64_t r, float scale,
                        Engine& eng) {
    const int64_t w = s.cache.width;
    // Float rows are read where they live (converted to bf16 on the way); quantised rows are
    // dequantised into f32 scratch first.
    using Rows = typename Engine::Rows;
    const bool direct = !s.cache.rows->quantised;
    const Rows rows_kind = direct ? s.cache.rows->float_kind() : Rows::f32;
    float* kr = direct ? nullptr : Scratch::get(tls.kr, kChunk * w);
    eng.begin(s.q, s.heads, w, r);
    const void* rows_at[2][kChunk];  // this chunk's rows and the next one's (direct formats)
    for (int64_t c0 = p.c_begin, i = 0; c0 < p.c_end; c0 += kChunk, i ^= 1) {
        const int64_t n = std::min(kChunk, p.c_end - c0);
        const void** chunk_rows = rows_at[i];
        if (direct) {
            if (c0 == p.c_begin)
                for (int64_t j = 0; j < n; ++j) chunk_rows[j] = s.cache.row(c0 + j);
            const int64_t next_n = std::clamp<int64_t>(p.c_end - c0 - kChunk, 0, kChunk);
            for (int64_t j = 0; j < next_n; ++j) rows_at[i ^ 1][j] = s.cache.row(c0 + kChunk + j);
            eng.chunk(chunk_rows, rows_kind, n, scale, rows_at[i ^ 1], next_n);
        } else {
            gather_chunk(K, s.cache, c0, n, kr);
            for (int64_t j = 0; j < n; ++j) chunk_rows[j] = kr + j * w;
            eng.chunk(chunk_rows, rows_kind, n, scale);
        }
    }
    eng.end(p.mx, p.l, p.o, r);
}

#if defined(MLA_HAVE_AMX)
thread_local AmxDecodeRows tls_amx;
static_assert(AmxDecodeRows::kRows == kChunk, "the AMX engine's chunk is the kernels' chunk");
#endif
#if defined(MLA_HAVE_AVX512BF16)
thread_local Bf16DecodeRows tls_bf16;
static_assert(Bf16DecodeRows::kRows == kChunk, "the bf16 engine's chunk is the kernels' chunk");
#endif

// How a call's single-token absorbed rows multiply: f32 kernels, AMX bf16 tiles, or AVX512-BF16
// dot products (both bf16 only under compute "bf16").
enum class DecodeRows { f32, amx, bf16 };

// Which path the absorbed decode rows of this call take: under compute "bf16", the kernel
// configuration's decode_rows engine (kernel_config.hpp), AMX tiles for the shapes they cover,
// else AVX512-BF16 dots where that engine allows them; f32 otherwise.
DecodeRows decode_rows_path(bool bf16_products, int64_t w, int64_t r) {
    if (!bf16_products || w % 32 != 0) return DecodeRows::f32;  // r < w: plan_attention
    const DecodeRowsEngine engine = kernels().decode_rows;
#if defined(MLA_HAVE_AMX)
    if (r % 64 == 0 && engine == DecodeRowsEngine::amx) return DecodeRows::amx;
#endif
#if defined(MLA_HAVE_AVX512BF16)
    if (r % 32 == 0 && engine >= DecodeRowsEngine::bf16) return DecodeRows::bf16;
#endif
    (void)engine;
    (void)r;
    return DecodeRows::f32;
}

// Whether the expanded form's scores and weighted sums take AVX512-BF16 dots (prefill_bf16.hpp):
// under compute "bf16" where the decode_rows engine allows bf16 products (bf16 or amx: AMX CPUs
// have AVX512-BF16 too) and the shapes pair up (the latent and key widths even, q_nope's and the
// values' widths in 16-column blocks).
// Measured: docs/KERNELS.md, "The expanded form (long prefills) in AVX512-BF16 dots".
bool expanded_bf16(bool bf16_products, int64_t r, int64_t dn, int64_t dr, int64_t dv) {
#if defined(MLA_HAVE_AVX512BF16)
    return bf16_products && kernels().decode_rows >= DecodeRowsEngine::bf16 && cpu_features().avx512_bf16 &&
           r % 2 == 0 && dn % 16 == 0 && dr % 2 == 0 && dv % 16 == 0;
#else
    (void)bf16_products, (void)r, (void)dn, (void)dr, (void)dv;
    return false;
#endif
}

// The AMX up-projection of a decode run (C[m, n] = A[m, k] . W[k, n], W bf16): its shape
// condition, and the call (never reached without MLA_HAVE_AMX: amx_decode is false there).
bool amx_up_fits(int64_t n, int64_t k) {
#if defined(MLA_HAVE_AMX)
    return amx_up_project_fits(n, k);
#else
    (void)n, (void)k;
    return false;
#endif
}

void up_project_amx(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* w, float* c,
                    int64_t ldc) {
#if defined(MLA_HAVE_AMX)
    amx_up_project(m, n, k, a, lda, w, n, c, ldc);
#else
    (void)m, (void)n, (void)k, (void)a, (void)lda, (void)w, (void)c, (void)ldc;
#endif
}

// How many context splits for each sequence (the plan step, FlashInfer-style): with one
// thread none; else the work (rows x chunks) is cut into parts of about 1/(4 * threads) of the
// total, so batch 1 uses every core and uneven lengths balance under dynamic scheduling, while
// each part keeps at least 4 chunks (its merge costs one output row per query row) and a
// sequence never has more parts than 2 * threads (each holds a [rows, r] partial output).
void plan_splits(const std::vector<AbsorbedSeq>& seqs, int num_threads, std::vector<int64_t>& splits) {
    splits.assign(seqs.size(), 1);
    if (num_threads <= 1) return;
    auto chunks = [](const AbsorbedSeq& s) { return (s.seq_len + kChunk - 1) / kChunk; };
    double total = 0;
    for (const auto& s : seqs) total += double(s.qlen * s.heads) * chunks(s);
    const double target = total / (4.0 * num_threads);
    for (size_t i = 0; i < seqs.size(); ++i) {
        const double cost = double(seqs[i].qlen * seqs[i].heads) * chunks(seqs[i]);
        const int64_t want = static_cast<int64_t>(std::ceil(cost / target - 1e-9));
        splits[i] = std::max<int64_t>(1, std::min({want, chunks(seqs[i]) / 4, int64_t(2) * num_threads}));
    }
}

// The buffers of the absorbed and expanded forms that outlive a call (Workspace::Attention).
struct AbsorbedRef {
    int64_t b, start, qlen, offset;  // offset: first row in the packed buffers
    bool amx_up = false;             // a run of single-token sequences whose up-projections take AMX tiles
};
struct AbsorbedBuffers {
    std::vector<int64_t> splits, order, first;
    std::vector<std::pair<int64_t, int64_t>> merge_blocks;
    std::vector<Partial> parts;
    std::vector<float> state;  // every part's [mx | l | o]; each task initialises its own
};

// Grows v to at least n elements (never shrinks: the workspace keeps its largest size).
template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    return v.data();
}

void run_absorbed(const IsaKernels& K, const std::vector<AbsorbedSeq>& seqs, int64_t r, float scale,
                  const Threading& th, AbsorbedBuffers& buf, DecodeRows path = DecodeRows::f32) {
    std::vector<int64_t>& splits = buf.splits;
    plan_splits(seqs, th.num_threads, splits);
    std::vector<Partial>& parts = buf.parts;
    parts.clear();
    int64_t floats = 0;
    for (size_t i = 0; i < seqs.size(); ++i) floats += splits[i] * seqs[i].qlen * seqs[i].heads * (r + 2);
    float* cursor = grow(buf.state, floats);
    for (size_t i = 0; i < seqs.size(); ++i) {
        const int64_t rows = seqs[i].qlen * seqs[i].heads;
        const int64_t chunks = (seqs[i].seq_len + kChunk - 1) / kChunk;
        for (int64_t k = 0; k < splits[i]; ++k) {
            const int64_t b = chunks * k / splits[i] * kChunk;
            const int64_t e = std::min(seqs[i].seq_len, chunks * (k + 1) / splits[i] * kChunk);
            parts.push_back(Partial{static_cast<int64_t>(i), b, e, cursor, cursor + rows, cursor + 2 * rows});
            cursor += rows * (r + 2);
        }
    }
    // Largest parts first, so the last ones to be picked are the small ones.
    std::vector<int64_t>& order = buf.order;
    order.resize(parts.size());
    for (size_t k = 0; k < parts.size(); ++k) order[k] = static_cast<int64_t>(k);
    auto cost = [&](int64_t k) { return (parts[k].c_end - parts[k].c_begin) * seqs[parts[k].seq].qlen; };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cost(a) > cost(b); });
    dynamic_for(th, static_cast<int64_t>(parts.size()), [&](int64_t k) {
        const Partial& p = parts[order[k]];
        if (seqs[p.seq].qlen == 1) {
#if defined(MLA_HAVE_AMX)
            if (path == DecodeRows::amx) return absorbed_task_rows(K, seqs[p.seq], p, r, scale, tls_amx);
#endif
#if defined(MLA_HAVE_AVX512BF16)
            if (path == DecodeRows::bf16) return absorbed_task_rows(K, seqs[p.seq], p, r, scale, tls_bf16);
#endif
        }
        absorbed_task(K, seqs[p.seq], p, r, scale);
    });
    // Merge each sequence's splits: out = sum_k e^(m_k - M) o_k / sum_k e^(m_k - M) l_k, in
    // blocks of kMergeRows query rows (a batch-1 decode step's 16 heads are two tasks, not one
    // core's while the other waits).
    std::vector<int64_t>& first = buf.first;
    first.assign(seqs.size() + 1, 0);
    for (size_t i = 0; i < seqs.size(); ++i) first[i + 1] = first[i] + splits[i];
    std::vector<std::pair<int64_t, int64_t>>& blocks = buf.merge_blocks;  // (sequence, first row)
    blocks.clear();
    for (size_t i = 0; i < seqs.size(); ++i)
        for (int64_t row = 0; row < seqs[i].qlen * seqs[i].heads; row += kMergeRows)
            blocks.emplace_back(static_cast<int64_t>(i), row);
    dynamic_for(th, static_cast<int64_t>(blocks.size()), [&](int64_t bk) {
        const int64_t i = blocks[bk].first, row0 = blocks[bk].second;
        const AbsorbedSeq& s = seqs[i];
        for (int64_t row = row0; row < std::min(row0 + kMergeRows, s.qlen * s.heads); ++row) {
            float m = kNegInf;
            for (int64_t k = first[i]; k < first[i + 1]; ++k) m = std::max(m, parts[k].mx[row]);
            float denom = 0.f;
            float* out = s.out_lat + row * r;
            std::fill(out, out + r, 0.f);
            for (int64_t k = first[i]; k < first[i + 1]; ++k) {
                if (parts[k].mx[row] == kNegInf) continue;  // this split saw nothing for the row
                const float wgt = std::exp(parts[k].mx[row] - m);
                denom += wgt * parts[k].l[row];
                const float* o = parts[k].o + row * r;
                for (int64_t d = 0; d < r; ++d) out[d] += wgt * o[d];
            }
            const float inv = 1.f / denom;
            for (int64_t d = 0; d < r; ++d) out[d] *= inv;
        }
    });
}

// ---------------------------------------------------------------- expanded form

struct ExpandedSeq {
    SeqCache cache;
    int64_t start, qlen, seq_len;
    const int32_t* pos = nullptr;    // sparse: the tokens' selected positions (expanded_sparse_task)
    const int64_t* first = nullptr;  // [qlen + 1]: token t's are pos[first[t] .. first[t + 1])
};

constexpr int64_t kSpan = 512;   // keys up-projected at once per head (their K and V stay in scratch)
constexpr int64_t kQTile = 64;   // query rows whose scores and outputs stay cache-resident

int64_t panels(int64_t n) { return (n + 15) / 16; }

// One (sequence, head). The context is walked in spans: each span's latent rows are
// up-projected once (K_nope = kv_c W_UK^T, V = kv_c W_UV), then every tile of new tokens that
// sees the span attends to it chunk by chunk, with its online-softmax state kept across spans.
// Keys are rows [K_nope | k_pe] read by row_dot (no transposes); V and the head's weights are
// packed in panels for gemm_packed. bf16 (expanded_bf16): the up-projections, the scores and the
// weighted sums take AVX512-BF16 dots (prefill_bf16.hpp: the latent rows and the head's weights,
// then the span's keys and values, rounded to bf16 once); the online softmax stays f32.
void expanded_task(const IsaKernels& K, const ExpandedSeq& s, int64_t h, int64_t heads, const float* qn,
                   const float* qp, const float* wuk, const float* wuv, int64_t r, int64_t dn, int64_t dr,
                   int64_t dv, float scale, float* out /*[T, H, dv]*/, bool bf16) {
    const int64_t w = s.cache.width, dk = dn + dr;
    Scratch& sc = tls;
    float* kr = Scratch::get(sc.kr, kChunk * w);
    float* krow = Scratch::get(sc.krow, kSpan * dk);                // [kSpan, dk]: key rows of the span
    float* v = Scratch::get(sc.v, panels(dv) * kSpan * 16);         // V [kSpan, dv] in panels
    float* wk = Scratch::get(sc.wk, panels(dn) * r * 16);           // W_UK_h^T [r, dn] in panels (bf16: row-major)
    float* wv = Scratch::get(sc.wv, panels(dv) * r * 16);           // W_UV_h [r, dv] in panels
    float* qh = Scratch::get(sc.qh, s.qlen * dk);                   // [q_nope | q_pe] of this head
    float* sbuf = Scratch::get(sc.s, kQTile * kChunk + s.qlen * (dv + 2));
    float* o = sbuf + kQTile * kChunk;
    float* mx = o + s.qlen * dv;
    float* l = mx + s.qlen;
    std::fill(o, o + s.qlen * dv, 0.f);
    std::fill(mx, mx + s.qlen, kNegInf);
    std::fill(l, l + s.qlen, 0.f);
    if (dv % 16) std::fill(v, v + panels(dv) * kSpan * 16, 0.f);  // padding columns stay finite
    uint32_t *lpairs = nullptr, *wkpairs = nullptr, *wvpairs = nullptr;
    if (bf16) {  // B[p, j] as pairs along p: W_UK[h]^T read as r rows of dn, W_UV[h] as r rows of dv
        lpairs = Scratch::get(sc.lpairs, kChunk * r / 2);
        wkpairs = Scratch::get(sc.wkpairs, r / 2 * dn);
        wvpairs = Scratch::get(sc.wvpairs, r / 2 * dv);
        for (int64_t p = 0; p < r; ++p)  // W_UK[h]^T [r, dn] row-major in wk's scratch, then the pairs
            for (int64_t j = 0; j < dn; ++j) wk[p * dn + j] = wuk[(h * dn + j) * r + p];
        bf16_value_pairs(r, dn, wk, dn, 16, wkpairs);
        bf16_value_pairs(r, dv, wuv + h * r * dv, dv, 16, wvpairs);
    } else {
        pack_panels(wuk + h * dn * r, 1, r, r, dn, wk);   // B[p, j] = W_UK[h, j, p]
        pack_panels(wuv + h * r * dv, dv, 1, r, dv, wv);  // B[p, j] = W_UV[h, p, j]
    }
    for (int64_t t = 0; t < s.qlen; ++t) {
        std::copy_n(qn + ((s.start + t) * heads + h) * dn, dn, qh + t * dk);
        std::copy_n(qp + ((s.start + t) * heads + h) * dr, dr, qh + t * dk + dn);
    }
    const float* key_rows[kSpan];
    for (int64_t j = 0; j < kSpan; ++j) key_rows[j] = krow + j * dk;
    const int64_t pairs = dk / 2;
    uint32_t *qpairs = nullptr, *kpairs = nullptr, *vpairs = nullptr, *ppairs = nullptr;
    if (bf16) {
        qpairs = Scratch::get(sc.qpairs, s.qlen * pairs);
        kpairs = Scratch::get(sc.kpairs, kSpan * pairs);   // [kSpan / 16][pairs][16]
        vpairs = Scratch::get(sc.vpairs, kSpan / 2 * dv);  // [kSpan / 2][dv]
        ppairs = Scratch::get(sc.ppairs, kQTile * kChunk / 2);
        bf16_row_pairs(s.qlen, dk, qh, dk, qpairs, pairs);
    }
    const int64_t past = s.seq_len - s.qlen;  // new token t sees positions <= past + t
    for (int64_t s0 = 0; s0 < s.seq_len; s0 += kSpan) {
        const int64_t ns = std::min(kSpan, s.seq_len - s0);
        for (int64_t c = 0; c < ns; c += kChunk) {
            const int64_t n = std::min(kChunk, ns - c);
            gather_chunk(K, s.cache, s0 + c, n, kr);
            if (bf16) {  // V row-major into v: [kSpan, dv]
                bf16_row_pairs(n, r, kr, w, lpairs, r / 2);
                for (int64_t j = 0; j < n; ++j) {
                    std::fill_n(krow + (c + j) * dk, dn, 0.f);
                    std::fill_n(v + (c + j) * dv, dv, 0.f);
                }
                bf16_weighted_sum(n, r, lpairs, r / 2, wkpairs, dn, krow + c * dk, dk);  // K_nope
                bf16_weighted_sum(n, r, lpairs, r / 2, wvpairs, dv, v + c * dv, dv);     // V
            } else {
                K.gemm_packed(n, dn, r, kr, w, wk, r * 16, krow + c * dk, dk, 16, false);       // K_nope
                K.gemm_packed(n, dv, r, kr, w, wv, r * 16, v + c * 16, 16, kSpan * 16, false);  // V
            }
            for (int64_t j = 0; j < n; ++j) std::copy_n(kr + j * w + r, dr, krow + (c + j) * dk + dn);
        }
        if (bf16) {  // the span's keys and values rounded to bf16 once, for every tile of queries
            bf16_key_pairs(ns, dk, krow, dk, kpairs);
            bf16_value_pairs(ns, dv, v, dv, 16, vpairs);
        }
        for (int64_t q0 = std::max<int64_t>(0, s0 - past); q0 < s.qlen; q0 += kQTile) {
            const int64_t rows = std::min(kQTile, s.qlen - q0);
            for (int64_t c = 0; c < ns; c += kChunk) {
                const int64_t pos0 = s0 + c, n = std::min(kChunk, ns - c);
                const int64_t i0 = std::max<int64_t>(0, pos0 - past - q0);  // first row of the tile that sees it
                if (i0 >= rows) break;  // later chunks are later still
                const int64_t t = q0 + i0, rr = rows - i0;
                if (bf16)
                    bf16_scores(rr, n, pairs, qpairs + t * pairs, pairs, kpairs + c * pairs, sbuf, kChunk);
                else
                    K.row_dot(rr, n, dk, qh + t * dk, dk, key_rows + c, sbuf, kChunk, nullptr);
                auto visible = [&](int64_t i) { return std::clamp<int64_t>(past + t + i + 1 - pos0, 0, n); };
                softmax_step(K, sbuf, rr, scale, visible, mx + t, l + t, o + t * dv, dv, dv);
                // Rows whose causal limit falls inside this chunk sum only their visible keys (a
                // NaN/Inf value row past the limit must not reach them as 0 x NaN): one product
                // for the rows that see the whole chunk, one per row on the diagonal.
                int64_t full = rr;
                while (full > 0 && visible(full - 1) == n) --full;
                if (bf16) {
                    constexpr int64_t lp = kChunk / 2;  // a probability row's pairs
                    const uint32_t* vc = vpairs + c / 2 * dv;
                    bf16_row_pairs(rr, n + n % 2, sbuf, kChunk, ppairs, lp);  // 0 past each row's visible keys
                    // The diagonal's rows 4 at a time over the keys all 4 see (their first row's
                    // visible count, even), then each row alone over the rest of its own.
                    for (int64_t g = 0; g < full; g += 4) {
                        const int64_t m = std::min<int64_t>(4, full - g), common = visible(g) & ~int64_t(1);
                        if (common > 0) bf16_weighted_sum(m, common, ppairs + g * lp, lp, vc, dv, o + (t + g) * dv, dv);
                        for (int64_t i = g; i < g + m; ++i)
                            if (visible(i) > common)
                                bf16_weighted_sum(1, visible(i) - common, ppairs + i * lp + common / 2, lp,
                                                  vc + common / 2 * dv, dv, o + (t + i) * dv, dv);
                    }
                    if (full < rr) bf16_weighted_sum(rr - full, n, ppairs + full * lp, lp, vc, dv, o + (t + full) * dv, dv);
                    continue;
                }
                for (int64_t i = 0; i < full; ++i) {
                    const int64_t vis = visible(i);
                    if (vis > 0)
                        K.gemm_packed(1, dv, vis, sbuf + i * kChunk, kChunk, v + c * 16, kSpan * 16,
                                      o + (t + i) * dv, dv, 16, true);
                }
                if (full < rr)
                    K.gemm_packed(rr - full, dv, n, sbuf + full * kChunk, kChunk, v + c * 16, kSpan * 16,
                                  o + (t + full) * dv, dv, 16, true);
            }
        }
    }
    for (int64_t t = 0; t < s.qlen; ++t) {
        const float inv = 1.f / l[t];
        float* dst = out + ((s.start + t) * heads + h) * dv;
        for (int64_t d = 0; d < dv; ++d) dst[d] = o[t * dv + d] * inv;
    }
}

// expanded_task under sparse attention: token t attends only to its selected positions
// pos[first[t] .. first[t + 1]) (ascending). The context is up-projected span by span as there
// (a span no token selects from is skipped), V as rows this time, and each token gathers the key
// and value rows of its positions in the span, its online-softmax state kept across spans.
void expanded_sparse_task(const IsaKernels& K, const ExpandedSeq& s, int64_t h, int64_t heads, const float* qn,
                          const float* qp, const float* wuk, const float* wuv, int64_t r, int64_t dn, int64_t dr,
                          int64_t dv, float scale, float* out /*[T, H, dv]*/) {
    const int64_t w = s.cache.width, dk = dn + dr;
    const int32_t* pos = s.pos;
    const int64_t* first = s.first;
    Scratch& sc = tls;
    float* kr = Scratch::get(sc.kr, kChunk * w);
    float* krow = Scratch::get(sc.krow, kSpan * dk);                // [kSpan, dk]
    float* vrow = Scratch::get(sc.v, kSpan * dv);                   // [kSpan, dv]
    float* wk = Scratch::get(sc.wk, panels(dn) * r * 16);
    float* wv = Scratch::get(sc.wv, panels(dv) * r * 16);
    float* qh = Scratch::get(sc.qh, s.qlen * dk);
    float* sbuf = Scratch::get(sc.s, kChunk + s.qlen * (dv + 2));
    float* o = sbuf + kChunk;
    float* mx = o + s.qlen * dv;
    float* l = mx + s.qlen;
    if (static_cast<int64_t>(sc.cursor.size()) < s.qlen) sc.cursor.resize(static_cast<size_t>(s.qlen));
    int64_t* cur = sc.cursor.data();
    std::fill(o, o + s.qlen * dv, 0.f);
    std::fill(mx, mx + s.qlen, kNegInf);
    std::fill(l, l + s.qlen, 0.f);
    pack_panels(wuk + h * dn * r, 1, r, r, dn, wk);
    pack_panels(wuv + h * r * dv, dv, 1, r, dv, wv);
    for (int64_t t = 0; t < s.qlen; ++t) {
        std::copy_n(qn + ((s.start + t) * heads + h) * dn, dn, qh + t * dk);
        std::copy_n(qp + ((s.start + t) * heads + h) * dr, dr, qh + t * dk + dn);
        cur[t] = first[t];
    }
    const float* keys[kChunk];
    const float* vals[kChunk];
    for (int64_t s0 = 0; s0 < s.seq_len; s0 += kSpan) {
        const int64_t ns = std::min(kSpan, s.seq_len - s0);
        bool any = false;
        for (int64_t t = 0; t < s.qlen && !any; ++t) any = cur[t] < first[t + 1] && pos[cur[t]] < s0 + ns;
        if (!any) continue;
        for (int64_t c = 0; c < ns; c += kChunk) {
            const int64_t n = std::min(kChunk, ns - c);
            gather_chunk(K, s.cache, s0 + c, n, kr);
            K.gemm_packed(n, dn, r, kr, w, wk, r * 16, krow + c * dk, dk, 16, false);  // K_nope
            for (int64_t j = 0; j < n; ++j) std::copy_n(kr + j * w + r, dr, krow + (c + j) * dk + dn);
            K.gemm_packed(n, dv, r, kr, w, wv, r * 16, vrow + c * dv, dv, 16, false);  // V
        }
        for (int64_t t = 0; t < s.qlen; ++t) {
            int64_t e = cur[t];
            while (e < first[t + 1] && pos[e] < s0 + ns) ++e;
            for (int64_t a = cur[t]; a < e; a += kChunk) {
                const int64_t n = std::min(kChunk, e - a);
                for (int64_t j = 0; j < n; ++j) {
                    keys[j] = krow + (pos[a + j] - s0) * dk;
                    vals[j] = vrow + (pos[a + j] - s0) * dv;
                }
                K.row_dot(1, n, dk, qh + t * dk, dk, keys, sbuf, kChunk, nullptr);
                softmax_step(K, sbuf, 1, scale, [n](int64_t) { return n; }, mx + t, l + t, o + t * dv, dv, dv);
                K.row_axpy(1, n, dv, sbuf, kChunk, vals, o + t * dv, dv, nullptr);
            }
            cur[t] = e;
        }
    }
    for (int64_t t = 0; t < s.qlen; ++t) {
        const float inv = 1.f / l[t];
        float* dst = out + ((s.start + t) * heads + h) * dv;
        for (int64_t d = 0; d < dv; ++d) dst[d] = o[t * dv + d] * inv;
    }
}

// f32 view of a float tensor: the tensor itself when f32, else a converted copy kept in `keep`.
const float* as_f32(const TensorView& t, std::vector<float>& keep) {
    if (t.dtype == DType::f32) return t.ptr<const float>();
    to_f32(t.data, t.dtype, grow(keep, t.numel()), t.numel());
    return keep.data();
}

}  // namespace

// The buffers one op reuses across calls (the largest call's size).
struct Workspace::Attention {
    AbsorbedBuffers absorbed;
    std::vector<AbsorbedSeq> seqs;
    std::vector<AbsorbedRef> refs, runs;  // absorbed sequences; their runs of consecutive tokens
    std::vector<ExpandedSeq> expanded;
    std::vector<float> q_lat, lat, out_f32, q_f32[2], w_f32[2];
    std::vector<int32_t> sparse_pos;     // sparse: every token's selected positions, ascending
    std::vector<int64_t> sparse_first;   // [T + 1]: token t's are sparse_pos[first[t] .. first[t + 1])
};

Workspace::Workspace() = default;
Workspace::~Workspace() = default;

static Workspace::Attention& attention_buffers(Workspace& ws) {
    if (!ws.attention) ws.attention = std::make_unique<Workspace::Attention>();
    return *ws.attention;
}

// ---------------------------------------------------------------- MlaPagedAttention

static const char* kAttn = "MlaPagedAttention";

AttentionPlan plan_attention(const TensorView& q_nope, const TensorView& q_pe, const TensorView& cache_in,
                             const TensorView& w_uk, const TensorView& w_uv, const TensorView& qsl,
                             const TensorView& seq_lens, const TensorView& bt, float scale, Form form,
                             KvDtype kv_dtype, const TensorView* topk) {
    for (const TensorView* t : {&q_nope, &q_pe, &w_uk, &w_uv}) {
        check_rank(kAttn, *t, 3);
        check_float(kAttn, *t);
    }
    if (form != Form::automatic && form != Form::absorbed && form != Form::expanded)
        throw Error(std::string(kAttn) + ": attribute 'form' must be 0 (auto), 1 (absorbed) or 2 (expanded), got " +
                    std::to_string(static_cast<int64_t>(form)));
    const CacheRows rows = cache_rows(kAttn, cache_in, kv_dtype, w_uk.dim(2), /*writable=*/false);
    const TensorView& cache = rows.logical;
    const int64_t t_count = q_nope.dim(0), heads = q_nope.dim(1), dn = q_nope.dim(2);
    const int64_t r = w_uk.dim(2), w = cache.dim(2);
    check_dim(kAttn, q_pe, 0, t_count, "the number of tokens T of q_nope");
    check_dim(kAttn, q_pe, 1, heads, "the number of heads H of q_nope");
    check_dim(kAttn, w_uk, 0, heads, "the number of heads H of q_nope");
    check_dim(kAttn, w_uk, 1, dn, "the nope dim of q_nope");
    if (r <= 0 || r >= w)
        fail(kAttn, w_uk, "rank r = " + std::to_string(r) + " must be below the cache row width " + std::to_string(w));
    check_dim(kAttn, q_pe, 2, w - r, "cache row width minus w_uk's rank r");
    check_dim(kAttn, w_uv, 0, heads, "the number of heads H of q_nope");
    check_dim(kAttn, w_uv, 1, r, "the rank r of w_uk");
    const int64_t batch = check_new_tokens(kAttn, qsl, seq_lens, bt, cache, t_count, "q_nope");
    if (topk) check_topk(kAttn, *topk, qsl, seq_lens, batch, t_count);
    AttentionPlan plan{AttentionShapes{t_count, heads, w_uv.dim(2)}, rows, &q_nope, &q_pe, &w_uk, &w_uv, &qsl,
                       &seq_lens, &bt, scale, form};
    plan.topk = topk;
    return plan;
}

void check_topk(const char* op, const TensorView& idx, const TensorView& qsl, const TensorView& seq_lens,
                int64_t batch, int64_t t_count) {
    check_index(op, idx);
    check_rank(op, idx, 2);
    check_dim(op, idx, 0, t_count, "the number of new tokens T");
    if (idx.dim(1) < 1) fail(op, idx, "must list at least one position per token, got shape " + shape_str(idx.shape));
    const int64_t k = idx.dim(1);
    // Marks of the positions the current token listed, cleared again after each token (so a call
    // costs O(T x K), not O(T x context)).
    thread_local std::vector<uint8_t> mark;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t start = index_at(qsl, b), qlen = index_at(qsl, b + 1) - start;
        const int64_t past = index_at(seq_lens, b) - qlen;
        if (static_cast<int64_t>(mark.size()) < past + qlen) mark.resize(static_cast<size_t>(past + qlen), 0);
        for (int64_t t = start; t < start + qlen; ++t) {
            const int64_t limit = past + (t - start) + 1;  // the token sees positions [0, limit)
            int64_t count = 0;
            auto clear = [&](int64_t upto) {
                for (int64_t j = 0; j < upto; ++j) {
                    const int64_t v = index_at(idx, t * k + j);
                    if (v >= 0 && v < limit) mark[static_cast<size_t>(v)] = 0;
                }
            };
            for (int64_t j = 0; j < k; ++j) {
                const int64_t v = index_at(idx, t * k + j);
                if (v == -1) continue;
                const std::string at = " at [" + std::to_string(t) + ", " + std::to_string(j) + "]";
                if (v < 0 || v >= limit) {
                    clear(j);
                    fail(op, idx, "holds position " + std::to_string(v) + at + ", outside [0, " + std::to_string(limit) +
                                      ") (the positions token " + std::to_string(t) + " may see; -1 = none)");
                }
                if (mark[static_cast<size_t>(v)]) {
                    clear(j);
                    fail(op, idx, "holds position " + std::to_string(v) + " twice for token " + std::to_string(t) +
                                      " (again" + at + ")");
                }
                mark[static_cast<size_t>(v)] = 1;
                ++count;
            }
            clear(k);
            if (count == 0) fail(op, idx, "selects no position for token " + std::to_string(t) + " (all -1)");
        }
    }
}

Form choose_form(int64_t qlen, int64_t seq_len, int64_t heads, int64_t r, int64_t dr, int64_t dn, int64_t dv) {
    const double pairs = double(qlen) * double(seq_len - qlen) + double(qlen) * double(qlen + 1) / 2.0;
    return form_by_cost(qlen, seq_len, pairs, heads, r, dr, dn, dv);
}

Form sparse_form(int64_t qlen, int64_t seq_len, double pairs, int64_t heads, int64_t r, int64_t dr, int64_t dn,
                 int64_t dv) {
    // Under sparse attention the expanded form attends one query row at a time to gathered key
    // rows (each token its own positions), where the absorbed form keeps every head of a token in
    // one product over its gathered latent rows (and the AMX / bf16 row engines under compute
    // "bf16"). Measured at V3.2's dims, a 4096-token prefill with top-2048 (AMX, bf16 hint):
    // absorbed 6.0 s, expanded 13.6 s for about 3.4x fewer products; so expanded only when its
    // count of products is more than 4x below.
    const double absorbed = double(qlen) * heads * (dn * r + r * dv) + pairs * heads * (2 * r + dr);
    const double expanded = double(seq_len) * heads * (dn + dv) * r + pairs * heads * (dn + dr + dv);
    return 4.0 * expanded < absorbed ? Form::expanded : Form::absorbed;
}

Form form_by_cost(int64_t qlen, int64_t seq_len, double pairs, int64_t heads, int64_t r, int64_t dr, int64_t dn,
                  int64_t dv) {
    const double absorbed = double(qlen) * heads * (dn * r + r * dv) + pairs * heads * (2 * r + dr);
    const double expanded = double(seq_len) * heads * (dn + dv) * r + pairs * heads * (dn + dr + dv);
    return expanded < absorbed ? Form::expanded : Form::absorbed;
}

void run_attention(const AttentionPlan& plan, const TensorView& out, const Threading& th, Workspace& ws_all) {
    Workspace::Attention& ws = attention_buffers(ws_all);
    const AttentionShapes& shp = plan.shapes;
    const TensorView &qsl = *plan.query_start_loc, &seq_lens = *plan.seq_lens, &bt = *plan.block_tables;
    const CacheRows& cache = plan.cache;
    const int64_t heads = shp.heads, dn = plan.q_nope->dim(2), dr = plan.q_pe->dim(2), r = plan.w_uk->dim(2);
    const int64_t dv = shp.v_dim, w = cache.width, batch = qsl.dim(0) - 1;
    const float scale = plan.scale;
    const float* qn = as_f32(*plan.q_nope, ws.q_f32[0]);
    const float* qp = as_f32(*plan.q_pe, ws.q_f32[1]);
    const IsaKernels& K = isa();
    // bf16 up-projections (a bf16 export's) are read as they are by the absorbed form, at half an
    // f32 copy's bytes; f32 views are made only for the expanded form (or f16 weights).
    const bool w_bf16 = plan.w_uk->dtype == DType::bf16 && plan.w_uv->dtype == DType::bf16;
    const uint16_t* wuk16 = w_bf16 ? plan.w_uk->ptr<uint16_t>() : nullptr;
    const uint16_t* wuv16 = w_bf16 ? plan.w_uv->ptr<uint16_t>() : nullptr;
    const float* wuk = nullptr;
    const float* wuv = nullptr;
    const auto f32_weights = [&] {
        if (wuk) return;
        wuk = as_f32(*plan.w_uk, ws.w_f32[0]);
        wuv = as_f32(*plan.w_uv, ws.w_f32[1]);
    };
    // C[m, n] = A[m, k] . W[k, n] for a head's W at element offset `at` of W_UK or W_UV.
    // amx: a run of single-token sequences under the AMX decode path (AbsorbedRef::amx_up; bf16 weights).
    const auto up_project = [&](bool amx, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                const float* wf, const uint16_t* wb, int64_t at, float* c, int64_t ldc) {
        if (amx)
            up_project_amx(m, n, k, a, lda, wb + at, c, ldc);
        else if (w_bf16)
            K.gemm_bf16b(m, n, k, a, lda, wb + at, n, c, ldc, false);
        else
            K.gemm(m, n, k, a, lda, wf + at, n, c, ldc, false);
    };
    float* of = out.dtype == DType::f32 ? out.ptr<float>() : grow(ws.out_f32, shp.tokens * heads * dv);

    // Sparse attention: every token's selected positions, without the -1 padding, ascending
    // (validated by plan_attention: distinct, causal, at least one).
    const bool sparse = plan.topk != nullptr;
    std::vector<int32_t>& sp_pos = ws.sparse_pos;
    std::vector<int64_t>& sp_first = ws.sparse_first;
    if (sparse) {
        const int64_t k = plan.topk->dim(1);
        sp_pos.clear();
        sp_first.assign(1, 0);
        for (int64_t t = 0; t < shp.tokens; ++t) {
            const size_t from = sp_pos.size();
            for (int64_t j = 0; j < k; ++j) {
                const int64_t v = index_at(*plan.topk, t * k + j);
                if (v >= 0) sp_pos.push_back(static_cast<int32_t>(v));
            }
            if (!std::is_sorted(sp_pos.begin() + from, sp_pos.end())) std::sort(sp_pos.begin() + from, sp_pos.end());
            sp_first.push_back(static_cast<int64_t>(sp_pos.size()));
        }
    }

    std::vector<ExpandedSeq>& expanded = ws.expanded;
    std::vector<AbsorbedRef>& absorbed = ws.refs;
    expanded.clear();
    absorbed.clear();
    int64_t absorbed_rows = 0;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t start = index_at(qsl, b), qlen = index_at(qsl, b + 1) - start, len = index_at(seq_lens, b);
        if (qlen == 0) continue;
        Form f = plan.form;
        if (f == Form::automatic)
            f = sparse ? sparse_form(qlen, len, double(sp_first[start + qlen] - sp_first[start]), heads, r, dr, dn, dv)
                       : choose_form(qlen, len, heads, r, dr, dn, dv);
        if (f == Form::expanded) {
            expanded.push_back(ExpandedSeq{seq_cache(cache, bt, b), start, qlen, len});
            if (sparse) {
                expanded.back().pos = sp_pos.data();
                expanded.back().first = sp_first.data() + start;
            }
        } else {
            absorbed.push_back(AbsorbedRef{b, start, qlen, absorbed_rows});
            absorbed_rows += qlen * heads;
        }
    }

    if (!absorbed.empty()) {
        if (!w_bf16) f32_weights();
        // q_lat = [q_nope @ W_UK | q_pe] for every (token, head) of the absorbed sequences.
        float* q_lat = grow(ws.q_lat, absorbed_rows * w);
        float* lat = grow(ws.lat, absorbed_rows * r);
        // The absorbed sequences' tokens in runs of consecutive tokens (a decode batch, or any
        // batch without an expanded sequence between them, is one run): each head's
        // up-projections take a run's tokens as the rows of one product, so its weights are read
        // once per run instead of once per sequence. A run's rows follow each other in q_lat / lat
        // as its sequences' do (row = offset + t * heads + h).
        // Under the AMX decode path, runs of single-token sequences take their up-projections on
        // AMX tiles too (amx_up_project: bf16 weights as stored, inputs rounded to bf16), so they
        // are not merged with multi-token runs, which keep f32 products.
        const DecodeRows path = decode_rows_path(plan.bf16_products, w, r);
        const bool amx_up = path == DecodeRows::amx && w_bf16 && amx_up_fits(r, dn) && amx_up_fits(dv, r);
        std::vector<AbsorbedRef>& runs = ws.runs;
        runs.clear();
        for (const AbsorbedRef& a : absorbed) {
            const bool decode = amx_up && a.qlen == 1;
            if (!runs.empty() && runs.back().start + runs.back().qlen == a.start && runs.back().amx_up == decode)
                runs.back().qlen += a.qlen;
            else
                runs.push_back(AbsorbedRef{a.b, a.start, a.qlen, a.offset, decode});
        }
        const int64_t n_runs = static_cast<int64_t>(runs.size());
        th.parallel_for(n_runs * heads, [&](int64_t k) {
            const AbsorbedRef& a = runs[k / heads];
            const int64_t h = k % heads;
            float* dst = q_lat + (a.offset + h) * w;
            up_project(a.amx_up, a.qlen, r, dn, qn + (a.start * heads + h) * dn, heads * dn, wuk, wuk16, h * dn * r,
                       dst, heads * w);
            for (int64_t t = 0; t < a.qlen; ++t)
                std::copy_n(qp + ((a.start + t) * heads + h) * dr, dr, dst + t * heads * w + r);
        });
        ws.seqs.clear();
        for (const AbsorbedRef& a : absorbed) {
            if (!sparse) {
                ws.seqs.push_back(AbsorbedSeq{seq_cache(cache, bt, a.b), q_lat + a.offset * w, a.qlen, heads,
                                              index_at(seq_lens, a.b), lat + a.offset * r});
                continue;
            }
            // Sparse: each token is a one-token "sequence" whose context is its selected positions
            // (so the single-token row engines serve it too).
            for (int64_t t = 0; t < a.qlen; ++t) {
                SeqCache sc = seq_cache(cache, bt, a.b);
                sc.positions = sp_pos.data() + sp_first[a.start + t];
                const int64_t row = a.offset + t * heads;
                ws.seqs.push_back(AbsorbedSeq{sc, q_lat + row * w, 1, heads,
                                              sp_first[a.start + t + 1] - sp_first[a.start + t], lat + row * r});
            }
        }
        run_absorbed(K, ws.seqs, r, scale, th, ws.absorbed, path);
        // o = o_lat @ W_UV per head, a run's tokens at once.
        th.parallel_for(n_runs * heads, [&](int64_t k) {
            const AbsorbedRef& a = runs[k / heads];
            const int64_t h = k % heads;
            up_project(a.amx_up, a.qlen, dv, r, lat + (a.offset + h) * r, heads * r, wuv, wuv16, h * r * dv,
                       of + (a.start * heads + h) * dv, heads * dv);
        });
    }
    if (!expanded.empty()) {
        f32_weights();
        const int64_t n_exp = static_cast<int64_t>(expanded.size());
        // Largest sequences first (their heads are the longest tasks).
        std::stable_sort(expanded.begin(), expanded.end(), [](const ExpandedSeq& a, const ExpandedSeq& b) {
            return a.qlen * a.seq_len > b.qlen * b.seq_len;
        });
        const bool bf16x = expanded_bf16(plan.bf16_products, r, dn, dr, dv);
        dynamic_for(th, n_exp * heads, [&](int64_t k) {
            const ExpandedSeq& e = expanded[k / heads];
            if (e.pos)
                expanded_sparse_task(K, e, k % heads, heads, qn, qp, wuk, wuv, r, dn, dr, dv, scale, of);
            else
                expanded_task(K, e, k % heads, heads, qn, qp, wuk, wuv, r, dn, dr, dv, scale, of, bf16x);
        });
    }
    if (out.dtype != DType::f32) from_f32(of, out.dtype, out.data, shp.tokens * heads * dv);
}

}  // namespace mla
