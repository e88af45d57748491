"""Where config.json's values enter the exporter: every key any family reads, checked for its JSON
type and a sane range before anything is computed or allocated from it.

config.json is untrusted input: `num_hidden_layers: 1000000000` used to build a billion-entry
per-layer list before any other check, `max_position_embeddings: 2**31` an 8 GiB RoPE table, a
string where a number belongs a traceback deep in the RoPE code. `check_values` runs once on
the merged keys (defaults + the file's) before a family's `prepare` reads them, so every later
reader sees values of the right type inside these bounds; the families still check what only
they know (contradictions between keys). The maxima are generous multiples of the largest
released MLA models (DeepSeek-V3: 61 layers, hidden 7168, 128 heads, 256 experts; Mistral 4:
1,048,576 positions; LongCat-Flash: 768 router ids); the contract schema
(graphs/mla_graph.schema.json) states the same maxima for the facts an export records (a test
checks that they agree). Errors name the key: `config.json: <key> must be ..., got <value>`.
Only the standard library is imported here.
"""

from __future__ import annotations

import math

from ..formats.json_file import show

__all__ = ["MAX_LAYERS", "MAX_POSITIONS", "MAX_VOCAB", "MAX_ROPE_TABLE_BYTES", "check_values"]

MAX_LAYERS = 1024  # latent cache layers (DeepSeek-V3: 61; GLM-5: 78)
MAX_POSITIONS = 1 << 22  # 4 x Mistral 4's 1M context; positions are int32 in the graphs
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 4096
MAX_DIM = 1 << 16  # widths (hidden, ranks); head dims are bounded tighter
MAX_HEAD_DIM = 4096
MAX_FFN = 1 << 20
# The RoPE cos and sin tables are constants of the graph, [positions, qk_rope_head_dim] f32 each:
# refused above this (Mistral 4 at its full 1M context and dr 64: 512 MiB).
MAX_ROPE_TABLE_BYTES = 2 << 30

_INT, _NUM, _BOOL, _STR = "integer", "number", "boolean", "string"
# key: (JSON type, least, most); numbers are also required finite. None (JSON null) is read by
# config.py as "the family's default" for every key but q_lora_rank, so null is not checked here.
KEYS = {
    "num_hidden_layers": (_INT, 1, MAX_LAYERS),
    "num_layers": (_INT, 1, MAX_LAYERS // 2),  # LongCat-Flash: two cache layers each
    "hidden_size": (_INT, 1, MAX_DIM),
    "num_attention_heads": (_INT, 1, 1024),
    "vocab_size": (_INT, 1, MAX_VOCAB),
    "kv_lora_rank": (_INT, 1, MAX_DIM),
    "q_lora_rank": (_INT, 1, MAX_DIM),
    "qk_nope_head_dim": (_INT, 1, MAX_HEAD_DIM),
    "qk_rope_head_dim": (_INT, 1, MAX_HEAD_DIM),
    "v_head_dim": (_INT, 1, MAX_HEAD_DIM),
    "qk_head_dim": (_INT, 1, 2 * MAX_HEAD_DIM),
    "head_dim": (_INT, 1, 2 * MAX_HEAD_DIM),
    "intermediate_size": (_INT, 1, MAX_FFN),
    "ffn_hidden_size": (_INT, 1, MAX_FFN),
    "moe_intermediate_size": (_INT, 1, MAX_FFN),
    "expert_ffn_hidden_size": (_INT, 1, MAX_FFN),
    "max_position_embeddings": (_INT, 1, MAX_POSITIONS),
    "original_max_position_embeddings": (_INT, 1, MAX_POSITIONS),
    "n_routed_experts": (_INT, 1, MAX_EXPERTS),
    "num_local_experts": (_INT, 1, MAX_EXPERTS),
    "num_experts": (_INT, 1, MAX_EXPERTS),
    "num_experts_per_tok": (_INT, 1, MAX_EXPERTS),
    "moe_topk": (_INT, 1, MAX_EXPERTS),
    "n_shared_experts": (_INT, 0, MAX_EXPERTS),
    "num_shared_experts": (_INT, 0, MAX_EXPERTS),
    "zero_expert_num": (_INT, 0, MAX_EXPERTS),
    "n_group": (_INT, 1, MAX_EXPERTS),
    "topk_group": (_INT, 1, MAX_EXPERTS),
    "first_k_dense_replace": (_INT, 0, MAX_LAYERS),
    "moe_layer_freq": (_INT, 1, MAX_LAYERS),
    "index_n_heads": (_INT, 1, 1024),
    "index_head_dim": (_INT, 1, MAX_HEAD_DIM),
    "index_topk": (_INT, 1, MAX_POSITIONS),
    "index_topk_freq": (_INT, 0, MAX_LAYERS),
    "index_skip_topk_offset": (_INT, 0, MAX_LAYERS),
    "rms_norm_eps": (_NUM, 0, 1),
    "routed_scaling_factor": (_NUM, 0, 1e6),
    "rope_theta": (_NUM, 1, 1e15),
    "partial_rotary_factor": (_NUM, 0, 1),
    "scale_emb": (_NUM, 0, 1e6),
    "scale_depth": (_NUM, 0, 1e6),
    "dim_model_base": (_NUM, 0, MAX_DIM),
    "dtype": (_STR, None, None),  # the weights' float type (the export's default weight format)
    "torch_dtype": (_STR, None, None),
    "attention_bias": (_BOOL, None, None),
    "mlp_bias": (_BOOL, None, None),
    "tie_word_embeddings": (_BOOL, None, None),
    "norm_topk_prob": (_BOOL, None, None),
    "rope_interleave": (_BOOL, None, None),
    "indexer_rope_interleave": (_BOOL, None, None),
}
# Inside rope_parameters / rope_scaling (the keys the RoPE readers take from there).
ROPE_KEYS = {
    "rope_theta": KEYS["rope_theta"],
    "partial_rotary_factor": KEYS["partial_rotary_factor"],
    "original_max_position_embeddings": KEYS["original_max_position_embeddings"],
    "factor": (_NUM, 0, 1e6),
    "beta_fast": (_NUM, 0, 1e6),
    "beta_slow": (_NUM, 0, 1e6),
    "mscale": (_NUM, 0, 1e6),
    "mscale_all_dim": (_NUM, 0, 1e6),
    "attention_factor": (_NUM, 0, 1e6),
    "llama_4_scaling_beta": (_NUM, -1e6, 1e6),
    "truncate": (_BOOL, None, None),
}
# Keys whose lower bound is exclusive (a positive real): 0 is refused too.
_EXCLUSIVE = {"rms_norm_eps", "routed_scaling_factor", "partial_rotary_factor", "scale_emb", "scale_depth",
              "dim_model_base", "factor", "attention_factor"}


def _check(where: str, value, rule: tuple, exclusive: bool, error) -> None:
    kind, least, most = rule
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise error(f"config.json: {where} must be true or false, got {show(value)}")
        return
    if kind == _STR:
        if not isinstance(value, str):
            raise error(f"config.json: {where} must be a string, got {show(value)}")
        return
    if kind == _INT:
        ok = isinstance(value, int) and not isinstance(value, bool)
        what = "a positive integer" if least == 1 else f"an integer >= {least}"
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        what = "a positive number" if exclusive and least == 0 else \
            f"a number {'>' if exclusive else '>='} {least}"
    if not ok or value < least or (exclusive and value == least) or value > most:
        upper = most if isinstance(most, int) else f"{most:g}"
        raise error(f"config.json: {where} must be {what} and at most {upper}, got {show(value)}")


def check_values(d: dict, error) -> None:
    """Every key of `d` (config.json merged with the family's defaults) that a family reads: its
    type and range; rope_parameters / rope_scaling must be objects and their keys are checked
    too. Raises `error` naming the first bad key."""
    for key, rule in KEYS.items():
        if d.get(key) is not None:
            _check(key, d[key], rule, key in _EXCLUSIVE, error)
    for block in ("rope_parameters", "rope_scaling"):
        params = d.get(block)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise error(f"config.json: {block} must be an object, got {show(params)}")
        for key, rule in ROPE_KEYS.items():
            if params.get(key) is not None:
                _check(f"{block}.{key}", params[key], rule, key in _EXCLUSIVE, error)


def rope_table_bytes(positions: int, rope_dim: int) -> int:
    """Bytes of the graph's two f32 RoPE tables, [positions, rope_dim] each."""
    return 2 * 4 * positions * rope_dim
