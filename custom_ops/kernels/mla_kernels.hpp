// The three MLA kernels on raw pointers. Each entry point validates every input first (see
// validate.cpp) and throws mla::Error naming the input and the bad value; nothing is read or
// written before validation passes.
//
// Notation: r = kv_lora_rank, dr = rope dim, W = r + dr (the cache row), dn = nope dim,
// dv = value dim, H = heads, BS = block size, NB = blocks, M = block-table width.
#pragma once

#include "cache_format.hpp"
#include "mla_tensor.hpp"

namespace mla {

// Output shapes, computed after validation (used by the wrappers to allocate outputs).
struct DecodeShapes { int64_t batch, heads, rank; };
struct AttentionShapes { int64_t tokens, heads, v_dim; };

// kv_dtype (every op): the cache's row format (cache_format.hpp); automatic = by its element
// type, u8 bytes = bf16 rows.

// MlaCacheWrite: row [kv_c[t] | k_pe[t]] -> slot slot_mapping[t] (skipped when < 0), in place,
// rounded or quantised to the cache's format. Returns the number of rows written.
int64_t cache_write(const TensorView& kv_c, const TensorView& k_pe, const TensorView& kv_cache,
                    const TensorView& slot_mapping, const Threading& threading,
                    KvDtype kv_dtype = KvDtype::automatic);

// MlaPagedDecode: absorbed MQA over the latent rows, vLLM mla_decode_kvcache semantics.
DecodeShapes paged_decode_shapes(const TensorView& q, const TensorView& kv_cache,
                                 const TensorView& block_tables, const TensorView& seq_lens,
                                 int64_t kv_lora_rank, KvDtype kv_dtype = KvDtype::automatic);
void paged_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& block_tables,
                  const TensorView& seq_lens, float scale, int64_t kv_lora_rank,
                  const TensorView& out, const Threading& threading, KvDtype kv_dtype = KvDtype::automatic);

// MlaPagedAttention: causal attention of packed new tokens over their sequences' cached rows.
enum class Form : int64_t { automatic = 0, absorbed = 1, expanded = 2 };
AttentionShapes paged_attention_shapes(const TensorView& q_nope, const TensorView& q_pe,
                                       const TensorView& kv_cache, const TensorView& w_uk,
                                       const TensorView& w_uv, const TensorView& query_start_loc,
                                       const TensorView& seq_lens, const TensorView& block_tables,
                                       KvDtype kv_dtype = KvDtype::automatic);
void paged_attention(const TensorView& q_nope, const TensorView& q_pe, const TensorView& kv_cache,
                     const TensorView& w_uk, const TensorView& w_uv,
                     const TensorView& query_start_loc, const TensorView& seq_lens,
                     const TensorView& block_tables, float scale, Form form,
                     const TensorView& out, const Threading& threading,
                     KvDtype kv_dtype = KvDtype::automatic);

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

// Which vectorised code path this CPU runs ("avx2" or "generic").
const char* isa_name();

}  // namespace mla
