// The MLA kernels on raw pointers, each as validate -> plan -> run (FlashInfer's plan/run
// split, inside the op): plan_* validates every input once (validate.cpp; throws mla::Error
// naming the input and the bad value, before anything is read or written) and returns the
// output shape and what the run needs; run_* computes into buffers of a Workspace that the op
// owns and reuses across calls (no per-layer, per-step allocation once it has grown).
//
// Notation: r = kv_lora_rank, dr = rope dim, W = r + dr (the cache row), dn = nope dim,
// dv = value dim, H = heads, BS = block size, NB = blocks, M = block-table width.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "cache_format.hpp"
#include "kernel_config.hpp"
#include "mla_tensor.hpp"

namespace mla {

// Memory reused across calls of one op instance; grows to the largest call seen.
struct Workspace {
    Workspace();
    ~Workspace();
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    struct Attention;                      // latent_attention.cpp's buffers
    std::unique_ptr<Attention> attention;  // made on first use
    std::vector<uint8_t> slot_taken;       // cache_write: all 0 between calls
    std::vector<float> index_q, index_w;   // indexer: f32 copies of bf16/f16 q and weights
    std::vector<float> index_scores;       // indexer: one tile's scores when its context is split
};

// The workspace an op object owns. Runtimes may run one op object from several requests at
// once: a call that finds it busy runs with a fresh one instead of waiting.
class OpWorkspace {
public:
    template <class F>
    void use(F&& fn) {
        std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
        if (lock.owns_lock()) return fn(ws_);
        Workspace spare;
        fn(spare);
    }

private:
    std::mutex mutex_;
    Workspace ws_;
};

// Output shapes, computed after validation (used by the wrappers to allocate outputs).
struct AttentionShapes { int64_t tokens, heads, v_dim; };

// kv_dtype (every op): the cache's row format (cache_format.hpp); automatic = by its element
// type, u8 bytes = bf16 rows.

// MlaCacheWrite: row [kv_c[t] | k_pe[t]] -> slot slot_mapping[t] (skipped when < 0), in place,
// rounded or quantised to the cache's format. Returns the number of rows written.
int64_t cache_write(const TensorView& kv_c, const TensorView& k_pe, const TensorView& kv_cache,
                    const TensorView& slot_mapping, const Threading& threading, KvDtype kv_dtype,
                    Workspace& ws);

// MlaPagedAttention: causal attention of packed new tokens over their sequences' cached rows.
// A plan points at the caller's views, which must outlive it. Decode is its one-token-per-sequence
// call (query_start_loc = 0..B); the absorbed form then is vLLM's mla_decode_kvcache.
enum class Form : int64_t { automatic = 0, absorbed = 1, expanded = 2 };
struct AttentionPlan {
    AttentionShapes shapes;
    CacheRows cache;
    const TensorView *q_nope, *q_pe, *w_uk, *w_uv, *query_start_loc, *seq_lens, *block_tables;
    float scale;
    Form form;
    // Under compute "bf16" (the runtime's bf16 hint) decode rows may multiply in bf16 with f32
    // sums (AMX tiles where the CPU has them: attention_amx.hpp; else AVX512-BF16 dot products:
    // attention_bf16.hpp); false keeps every product f32.
    bool bf16_products = false;
    // Sparse attention (DeepSeek Sparse Attention): topk_indices [T, K] lists, per new token, the
    // cached positions it attends to (distinct, each at most its own position; -1 = none, at
    // least one listed); null = every position up to its own (causal).
    const TensorView* topk = nullptr;
};
AttentionPlan plan_attention(const TensorView& q_nope, const TensorView& q_pe, const TensorView& kv_cache,
                             const TensorView& w_uk, const TensorView& w_uv, const TensorView& query_start_loc,
                             const TensorView& seq_lens, const TensorView& block_tables, float scale, Form form,
                             KvDtype kv_dtype, const TensorView* topk_indices = nullptr);
// The checks of a topk_indices input against the new tokens' positions (shared with the indexer's tests).
void check_topk(const char* op, const TensorView& topk_indices, const TensorView& query_start_loc,
                const TensorView& seq_lens, int64_t batch, int64_t tokens);
// out [T, H, dv] (of plan.shapes).
void run_attention(const AttentionPlan& plan, const TensorView& out, const Threading& threading, Workspace& ws);

// MlaIndexerTopK: DeepSeek Sparse Attention's lightning indexer (sparse_indexer.cpp). q [T, Hi, D]
// (RoPE applied), weights [T, Hi] (every positive factor folded in), index_cache [NB, BS, D] (or
// its rows' bytes; any kv_dtype, rows of D values with no k_pe part), query_start_loc, seq_lens,
// block_tables as MlaPagedAttention's -> [T, topk] i32: per new token the topk cached positions
// of largest sum_h weights[t, h] * relu(q[t, h] . key[s]) among those it sees, ascending; a token
// that sees at most topk positions lists all of them, padded with -1.
struct IndexerPlan {
    int64_t tokens, heads, dim, topk;
    CacheRows cache;
    const TensorView *q, *weights, *query_start_loc, *seq_lens, *block_tables;
    // Under compute "bf16" the scores may multiply in bf16 with f32 sums on AMX tiles
    // (indexer_amx.hpp) where the CPU has them; false keeps every product f32.
    bool bf16_products = false;
};
IndexerPlan plan_indexer(const TensorView& q, const TensorView& weights, const TensorView& index_cache,
                         const TensorView& query_start_loc, const TensorView& seq_lens,
                         const TensorView& block_tables, int64_t topk, KvDtype kv_dtype);
// out [T, topk] i32.
void run_indexer(const IndexerPlan& plan, const TensorView& out, const Threading& threading, Workspace& ws);

// MlaStepCheck: the whole step's metadata checked before any layer runs (see step_check.cpp).
struct StepInputs {
    TensorView input_ids, positions, slot_mapping, query_start_loc, seq_lens, block_tables, logits_indices;
};
void step_check(const StepInputs& in, const std::vector<TensorView>& caches, int64_t vocab_size,
                int64_t max_positions);

// Which form a sequence of qlen new tokens over seq_len positions runs in under Form::automatic
// (exposed so tests can make sure both forms are exercised).
Form choose_form(int64_t qlen, int64_t seq_len, int64_t heads, int64_t r, int64_t dr, int64_t dn,
                 int64_t dv);
// Under sparse attention (`pairs` = the selected (query, key) pairs): absorbed unless expanded
// needs more than 4x fewer products (its per-token gathers run one query row at a time).
Form sparse_form(int64_t qlen, int64_t seq_len, double pairs, int64_t heads, int64_t r, int64_t dr, int64_t dn,
                 int64_t dv);
// The dense choice for `pairs` (query, key) products in all.
Form form_by_cost(int64_t qlen, int64_t seq_len, double pairs, int64_t heads, int64_t r, int64_t dr, int64_t dn,
                  int64_t dv);

// The kernel configuration (which tables and engines run) is kernel_config.hpp's.

}  // namespace mla
