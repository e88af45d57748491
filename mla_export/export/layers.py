"""The decoder layer's pieces as ONNX nodes, mirroring transformers 5.24's DeepSeek-V2/V3 code.

Activations are 2-D `[T, features]` (T = the packed new tokens of all sequences), so every
projection is a `Gemm(x, W, b, transB=1)` on the checkpoint's own `[out, in]` weight layout.

RoPE: all three layouts (V3 interleaved pairs, V3 rotate-half, V2 complex pairs) are computed
as rotate-half. For the two pair layouts the rope rows of the q and kv_a projections are
permuted at export ([0, 2, 4, .., 1, 3, 5, ..]), which turns the pair rotation into rotate-half
exactly (it is how transformers' V3 `apply_rotary_pos_emb_interleave` lays out its result). V2's
complex form returns the pairs interleaved instead; q_pe and k_pe then differ from our values by
the same permutation, which leaves every q . k product, hence the attention, unchanged. So the
cached k_pe is in rotate-half order for every model.
"""

from __future__ import annotations

import numpy as np

from ..checkpoint.config import MLAModelConfig
from ..ops.onnx_ops import (cache_update_node, cache_write_node, indexer_topk_node, paged_attention_node,
                        portable_attention_node)
from ..formats.weight_format import CODE_BITS
from .graph import GraphBuilder
from .qlinear import qlinear, qlinear_problem
from .quantize import FP8_BITS
from ..checkpoint.reader import CheckpointReader

__all__ = ["rms_norm", "linear", "attention", "dense_mlp", "deinterleave_perm", "rope_tables", "CUSTOM_OP_VARIANTS"]

# Graph variants whose MLA nodes are the mla_export custom ops: model.onnx ("custom") and, when its
# MoE form differs from model.onnx's, the IR's own source graph ("openvino").
CUSTOM_OP_VARIANTS = ("custom", "openvino")


def deinterleave_perm(dim: int) -> np.ndarray:
    return np.concatenate([np.arange(0, dim, 2), np.arange(1, dim, 2)])


def rope_tables(cfg: MLAModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos and signed-sin tables [max_pos, dr] for rotate-half: x * cos + swap_halves(x) * sin.

    freqs = position * inv_freq in float32 as transformers computes them; cos/sin evaluated in
    float64 and rounded, then scaled by YaRN's attention_scaling in float32 (as transformers)."""
    pos = np.arange(cfg.max_position_embeddings, dtype=np.float32)
    freqs = (pos[:, None] * cfg.rope.inv_freq()[None, :]).astype(np.float32)
    if cfg.rope.rope_type == "longrope":  # the long factors from original_max_position_embeddings on
        orig = cfg.rope.original_max_position_embeddings
        freqs[orig:] = (pos[orig:, None] * cfg.rope.inv_freq(long=True)[None, :]).astype(np.float32)
    scaling = np.float32(cfg.rope.cos_sin_scaling())
    cos = np.cos(freqs.astype(np.float64)).astype(np.float32) * scaling
    sin = np.sin(freqs.astype(np.float64)).astype(np.float32) * scaling
    return np.concatenate([cos, cos], axis=1), np.concatenate([-sin, sin], axis=1)


def rms_norm(g: GraphBuilder, x: str, weight: str, eps: float) -> str:
    """weight * (x * rsqrt(mean(x^2) + eps)), as DeepseekV3RMSNorm."""
    var = g.op("ReduceMean", g.op("Mul", x, x), g.i64(-1), keepdims=1)
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, g.f32(eps))))
    return g.op("Mul", weight, g.op("Mul", x, inv))


def norm(g: GraphBuilder, rd: CheckpointReader, name: str, x: str, size: int, eps: float) -> str:
    return rms_norm(g, x, g.f32_tensor(name, rd.get(name, (size,))), eps)


def linear(g: GraphBuilder, rd: CheckpointReader, prefix: str, x: str, n_out: int, n_in: int,
           bias: bool = False, rows: np.ndarray | None = None) -> str:
    """x @ W.T (+ b); `rows` reorders the output features (RoPE permutation).

    An int8 or int4 weight without bias is one MlaQLinear node in the graphs with our ops (the IR's
    and model.onnx): the CPU plugin's compressed MatMul decodes every code to bf16 per call, which
    made a V2-Lite decode step 1.17-1.2x (int4) and 1.17x (int8) longer at batch 1, prefill within
    2-7% (docs/WEIGHTS.md); onnxruntime would fold the dequantised Gemm into an f32 copy. The
    portable graph keeps the Gemm."""
    name = f"{prefix}.weight"
    w = rd.get(name, (n_out, n_in))
    if rows is not None:
        w = w[rows]
    fmt = g.store.format
    ours = [v for v in CUSTOM_OP_VARIANTS if v in g.variants]
    bits = fmt.bits("matmul", name)
    if (ours and not bias and not fmt.planning and bits in CODE_BITS
            and qlinear_problem(n_out, n_in, bits, fmt.group_size) is None):
        source = rd.fp8_rows(name, (n_out, n_in), rows) if bits == FP8_BITS else None
        y = qlinear(g.only(ours), name, w, x, bits, prefix, fp8_source=source)
        rest = g.only([v for v in g.variants if v not in ours])
        if rest.variants:  # the portable graph: a Gemm on the same weight, counted once
            rest.op("Gemm", x, rest.weight(name, w, record=False), transB=1, name=prefix)
        return y
    inputs = [x, g.weight(name, w)]
    if bias:
        b = rd.get(f"{prefix}.bias", (n_out,))
        inputs.append(g.f32_tensor(f"{prefix}.bias", b[rows] if rows is not None else b))
    return g.op("Gemm", *inputs, transB=1)


def _rope(g: GraphBuilder, x: str, cos: str, sin: str, half: int) -> str:
    first, second = g.op("Split", x, g.i64(half, half), axis=-1, n_out=2)
    swapped = g.op("Concat", second, first, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", swapped, sin))


def attention(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, i: int, x: str, io: dict,
              prefix: str | None = None) -> str:
    """MLA self-attention on normed hidden states x [T, hidden] -> [T, hidden], reading and writing
    cache layer i (`kv_cache.{i}`); its weights under `prefix` (default `model.layers.{i}.self_attn`).

    io: graph-level values (metadata input names, per-layer cache names, RoPE cos/sin rows)."""
    p = prefix or f"model.layers.{i}.self_attn"
    h, dn, dr, dv, r = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    hidden, qk = cfg.hidden_size, cfg.qk_head_dim
    perm = deinterleave_perm(dr) if cfg.rope_form in ("interleave", "complex") else np.arange(dr)
    q_rows = np.concatenate([np.concatenate([np.arange(dn), dn + perm]) + head * qk for head in range(h)])
    qa = None
    if cfg.q_lora_rank is None:
        q = linear(g, rd, f"{p}.q_proj", x, h * qk, hidden, rows=q_rows)
    else:
        qa = linear(g, rd, f"{p}.q_a_proj", x, cfg.q_lora_rank, hidden, bias=cfg.attention_bias)
        qa = norm(g, rd, f"{p}.q_a_layernorm.weight", qa, cfg.q_lora_rank, 1e-6)  # transformers: default eps
        q = linear(g, rd, f"{p}.q_b_proj", qa, h * qk, cfg.q_lora_rank, rows=q_rows)
    if cfg.block["q_lora_scale"] != 1.0:  # LongCat-Flash: q times sqrt(hidden / q_lora_rank)
        q = g.op("Mul", q, g.f32(cfg.block["q_lora_scale"]))
    q_nope, q_pe = g.op("Split", g.op("Reshape", q, g.i64(-1, h, qk)), g.i64(dn, dr), axis=2, n_out=2)
    kv_rows = np.concatenate([np.arange(r), r + perm])
    ckv = linear(g, rd, f"{p}.kv_a_proj_with_mqa", x, r + dr, hidden, bias=cfg.attention_bias, rows=kv_rows)
    kv_c, k_pe = g.op("Split", ckv, g.i64(r, dr), axis=1, n_out=2)
    kv_c = norm(g, rd, f"{p}.kv_a_layernorm.weight", kv_c, r, 1e-6)  # transformers: default eps
    if cfg.block["kv_lora_scale"] != 1.0:  # LongCat-Flash: the cached latent times sqrt(hidden / kv_lora_rank)
        kv_c = g.op("Mul", kv_c, g.f32(cfg.block["kv_lora_scale"]))
    q_pe = _rope(g, q_pe, io["cos_q"], io["sin_q"], dr // 2)
    k_pe = _rope(g, k_pe, io["cos_k"], io["sin_k"], dr // 2)
    if "q_scale" in io:  # Mistral 4: the whole query (both parts) times a per-position factor
        q_nope, q_pe = g.op("Mul", q_nope, io["q_scale"]), g.op("Mul", q_pe, io["q_scale"])

    # Absorbed up-projections from kv_b_proj [H * (dn + dv), r]: per head rows [k_nope (dn) | v (dv)].
    wkv = rd.get(f"{p}.kv_b_proj.weight", (h * (dn + dv), r)).reshape(h, dn + dv, r)
    # Operands of the custom attention op, not of a MatMul: kept float in every weight format
    # (ours: as stored when bf16; the portable graph's standard ops: f32).
    ours = [v for v in CUSTOM_OP_VARIANTS if v in g.variants]
    w_uk, w_uk_f32 = g.attention_weight(f"{p}.w_uk", np.ascontiguousarray(wkv[:, :dn, :]), ours)  # [H, dn, r]
    w_uv, w_uv_f32 = g.attention_weight(f"{p}.w_uv", np.ascontiguousarray(wkv[:, dn:, :].transpose(0, 2, 1)),
                                        ours)  # [H, r, dv]
    meta = [io["query_start_loc"], io["seq_lens"], io["block_tables"]]
    attn = f"layers.{i}.attn"
    cache = f"kv_cache.{i}"
    topk = sparse_indexer(g, rd, cfg, i, x, qa, io, p) if cfg.sparse else None
    for variant in CUSTOM_OP_VARIANTS:
        if variant in g.variants:
            written = f"layers.{i}.written"
            g.add_node(variant, cache_write_node(kv_c, k_pe, cache, io["slot_mapping"], written,
                                                 f"layers.{i}.cache_write", kv_dtype=io["kv_dtype"]))
            g.add_node(variant, paged_attention_node(q_nope, q_pe, cache, w_uk, w_uv, *meta, written, attn,
                                                     f"layers.{i}.paged_attention", scale=cfg.softmax_scale, form=0,
                                                     kv_dtype=io["kv_dtype"], topk_indices=topk))
    if "portable" in g.variants:
        updated = f"kv_cache_out.{i}"
        g.add_node("portable", cache_update_node(kv_c, k_pe, cache, io["slot_mapping"], updated, f"layers.{i}.cache_update"))
        g.add_node("portable", portable_attention_node(q_nope, q_pe, updated, w_uk_f32, w_uv_f32, *meta, attn,
                                                       f"layers.{i}.paged_attention", scale=cfg.softmax_scale))
    o = g.op("Reshape", attn, g.i64(-1, h * dv))
    return linear(g, rd, f"{p}.o_proj", o, hidden, h * dv, bias=cfg.attention_bias)


def _layer_norm(g: GraphBuilder, x: str, weight: str, bias: str, eps: float) -> str:
    """nn.LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * weight + bias."""
    centred = g.op("Sub", x, g.op("ReduceMean", x, g.i64(-1), keepdims=1))
    var = g.op("ReduceMean", g.op("Mul", centred, centred), g.i64(-1), keepdims=1)
    return g.op("Add", g.op("Mul", g.op("Div", centred, g.op("Sqrt", g.op("Add", var, g.f32(eps)))), weight), bias)


def sparse_indexer(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, i: int, x: str, qa: str, io: dict,
                   p: str) -> str:
    """DeepSeek Sparse Attention's lightning indexer of layer i -> the name of its [T, index_topk]
    selection (transformers' DeepseekV32Indexer; families/dsa.py). A "full" layer writes its keys to
    `index_cache.<j>` and scores them; a "shared" one (GLM-5) takes the previous full layer's
    selection (io["topk_indices"]).

    Interleaved indexer RoPE (GLM-5) is folded into the weights as for the main attention: the
    rotated rows of wq_b (per head) and of wk, LayerNorm's weight and bias with them, are
    permuted into rotate-half order; q . k is unchanged by a permutation of both.

    A layer past the model's (i >= num_layers: the MTP layer, export/mtp.py) runs its own indexer
    on `index_cache.<i>`: released V3.2 and GLM-5 checkpoints carry model.layers.<N>.self_attn.indexer.*
    for it, and vLLM gives it a key cache of its own."""
    sp = cfg.sparse
    mtp = i >= len(sp.indexer_types)
    if not mtp and sp.indexer_types[i] == "shared":
        return io["topk_indices"]
    hi, d, dr = sp.index_n_heads, sp.index_head_dim, cfg.qk_rope_head_dim
    ip = f"{p}.indexer"
    perm = deinterleave_perm(dr) if sp.rope_form == "interleave" else np.arange(dr)
    k_rows = np.concatenate([perm, np.arange(dr, d)])
    q_rows = np.concatenate([k_rows + head * d for head in range(hi)])
    iq = g.op("Reshape", linear(g, rd, f"{ip}.wq_b", qa, hi * d, cfg.q_lora_rank, rows=q_rows), g.i64(-1, hi, d))
    ik = linear(g, rd, f"{ip}.wk", x, d, cfg.hidden_size, rows=k_rows)
    ln_w = g.f32_tensor(f"{ip}.k_norm.weight", rd.get(f"{ip}.k_norm.weight", (d,))[k_rows])
    ln_b = g.f32_tensor(f"{ip}.k_norm.bias", rd.get(f"{ip}.k_norm.bias", (d,))[k_rows])
    ik = _layer_norm(g, ik, ln_w, ln_b, 1e-6)  # transformers: nn.LayerNorm(head_dim, eps=1e-6)
    if d > dr:
        iq_rot, iq_pass = g.op("Split", iq, g.i64(dr, d - dr), axis=2, n_out=2)
        ik_rot, ik_pass = g.op("Split", ik, g.i64(dr, d - dr), axis=1, n_out=2)
        iq = g.op("Concat", _rope(g, iq_rot, io["cos_q"], io["sin_q"], dr // 2), iq_pass, axis=2)
        ik = g.op("Concat", _rope(g, ik_rot, io["cos_k"], io["sin_k"], dr // 2), ik_pass, axis=1)
    else:
        iq = _rope(g, iq, io["cos_q"], io["sin_q"], dr // 2)
        ik = _rope(g, ik, io["cos_k"], io["sin_k"], dr // 2)
    # weights_proj(x) * Hi^-0.5, with the softmax scale D^-0.5 that transformers applies inside the
    # relu folded in (both positive: relu(a * s) = s * relu(a)).
    w = g.op("Mul", linear(g, rd, f"{ip}.weights_proj", x, hi, cfg.hidden_size), g.f32(hi ** -0.5 * d ** -0.5))
    no_rope = g.op("Slice", ik, g.i64(d), g.i64(d), g.i64(1))  # [T, 0]: indexer rows have no k_pe part
    j = i if mtp else sp.index_layer(i)  # the MTP draft's cache input is named by its layer (contract.mtp_graph_io)
    cache, topk = f"index_cache.{j}", f"layers.{i}.topk_indices"
    for variant in CUSTOM_OP_VARIANTS:
        if variant in g.variants:
            written = f"layers.{i}.index_written"
            g.add_node(variant, cache_write_node(ik, no_rope, cache, io["slot_mapping"], written,
                                                 f"layers.{i}.index_cache_write", kv_dtype=io["kv_dtype"]))
            g.add_node(variant, indexer_topk_node(iq, w, cache, io["query_start_loc"], io["seq_lens"],
                                                  io["block_tables"], written, topk, f"layers.{i}.indexer_topk",
                                                  topk=sp.index_topk, kv_dtype=io["kv_dtype"]))
    io["topk_indices"] = topk
    return topk


def dense_mlp(g: GraphBuilder, rd: CheckpointReader, prefix: str, x: str, hidden: int, inter: int, bias: bool) -> str:
    """down(silu(gate(x)) * up(x))."""
    gate = linear(g, rd, f"{prefix}.gate_proj", x, inter, hidden, bias=bias)
    up = linear(g, rd, f"{prefix}.up_proj", x, inter, hidden, bias=bias)
    act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
    return linear(g, rd, f"{prefix}.down_proj", act, hidden, inter, bias=bias)
