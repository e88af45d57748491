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
from onnx import TensorProto

from ..config import MLAModelConfig
from ..onnx_ops import (cache_update_node, cache_write_node, paged_attention_node, portable_attention_node)
from .graph import GraphBuilder
from .weights import CheckpointReader

__all__ = ["rms_norm", "linear", "attention", "dense_mlp", "moe", "deinterleave_perm", "rope_tables"]


def deinterleave_perm(dim: int) -> np.ndarray:
    return np.concatenate([np.arange(0, dim, 2), np.arange(1, dim, 2)])


def rope_tables(cfg: MLAModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos and signed-sin tables [max_pos, dr] for rotate-half: x * cos + swap_halves(x) * sin.

    freqs = position * inv_freq in float32 as transformers computes them; cos/sin evaluated in
    float64 and rounded, then scaled by YaRN's attention_scaling in float32 (as transformers)."""
    inv_freq = cfg.rope.inv_freq()
    pos = np.arange(cfg.max_position_embeddings, dtype=np.float32)
    freqs = (pos[:, None] * inv_freq[None, :]).astype(np.float32)
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
    """x @ W.T (+ b); `rows` reorders the output features (RoPE permutation)."""
    w = rd.get(f"{prefix}.weight", (n_out, n_in))
    inputs = [x, None]
    if rows is not None:
        w = w[rows]
    inputs[1] = g.weight(f"{prefix}.weight", w)
    if bias:
        b = rd.get(f"{prefix}.bias", (n_out,))
        inputs.append(g.f32_tensor(f"{prefix}.bias", b[rows] if rows is not None else b))
    return g.op("Gemm", *inputs, transB=1)


def _rope(g: GraphBuilder, x: str, cos: str, sin: str, half: int) -> str:
    first, second = g.op("Split", x, g.i64(half, half), axis=-1, n_out=2)
    swapped = g.op("Concat", second, first, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", swapped, sin))


def attention(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, i: int, x: str, io: dict) -> str:
    """MLA self-attention of layer i on normed hidden states x [T, hidden] -> [T, hidden].

    io: graph-level values (metadata input names, per-layer cache names, RoPE cos/sin rows)."""
    p = f"model.layers.{i}.self_attn"
    h, dn, dr, dv, r = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    hidden, qk = cfg.hidden_size, cfg.qk_head_dim
    perm = deinterleave_perm(dr) if cfg.rope_form in ("interleave", "complex") else np.arange(dr)
    q_rows = np.concatenate([np.concatenate([np.arange(dn), dn + perm]) + head * qk for head in range(h)])
    if cfg.q_lora_rank is None:
        q = linear(g, rd, f"{p}.q_proj", x, h * qk, hidden, rows=q_rows)
    else:
        qa = linear(g, rd, f"{p}.q_a_proj", x, cfg.q_lora_rank, hidden, bias=cfg.attention_bias)
        qa = norm(g, rd, f"{p}.q_a_layernorm.weight", qa, cfg.q_lora_rank, 1e-6)  # transformers: default eps
        q = linear(g, rd, f"{p}.q_b_proj", qa, h * qk, cfg.q_lora_rank, rows=q_rows)
    q_nope, q_pe = g.op("Split", g.op("Reshape", q, g.i64(-1, h, qk)), g.i64(dn, dr), axis=2, n_out=2)
    kv_rows = np.concatenate([np.arange(r), r + perm])
    ckv = linear(g, rd, f"{p}.kv_a_proj_with_mqa", x, r + dr, hidden, bias=cfg.attention_bias, rows=kv_rows)
    kv_c, k_pe = g.op("Split", ckv, g.i64(r, dr), axis=1, n_out=2)
    kv_c = norm(g, rd, f"{p}.kv_a_layernorm.weight", kv_c, r, 1e-6)  # transformers: default eps
    q_pe = _rope(g, q_pe, io["cos_q"], io["sin_q"], dr // 2)
    k_pe = _rope(g, k_pe, io["cos_k"], io["sin_k"], dr // 2)

    # Absorbed up-projections from kv_b_proj [H * (dn + dv), r]: per head rows [k_nope (dn) | v (dv)].
    wkv = rd.get(f"{p}.kv_b_proj.weight", (h * (dn + dv), r)).reshape(h, dn + dv, r)
    # Operands of the custom attention op, not of a MatMul: kept float in every weight format.
    w_uk = g.weight(f"{p}.w_uk", np.ascontiguousarray(wkv[:, :dn, :]), kind="float")  # [H, dn, r]
    w_uv = g.weight(f"{p}.w_uv", np.ascontiguousarray(wkv[:, dn:, :].transpose(0, 2, 1)), kind="float")  # [H, r, dv]
    meta = [io["query_start_loc"], io["seq_lens"], io["block_tables"]]
    attn = f"layers.{i}.attn"
    cache = f"kv_cache.{i}"
    if "custom" in g.variants:
        written = f"layers.{i}.written"
        g.add_node("custom", cache_write_node(kv_c, k_pe, cache, io["slot_mapping"], written, f"layers.{i}.cache_write",
                                              kv_dtype=io["kv_dtype"]))
        g.add_node("custom", paged_attention_node(q_nope, q_pe, cache, w_uk, w_uv, *meta, written, attn,
                                                  f"layers.{i}.paged_attention", scale=cfg.softmax_scale, form=0,
                                                  kv_dtype=io["kv_dtype"]))
    if "portable" in g.variants:
        updated = f"kv_cache_out.{i}"
        g.add_node("portable", cache_update_node(kv_c, k_pe, cache, io["slot_mapping"], updated, f"layers.{i}.cache_update"))
        g.add_node("portable", portable_attention_node(q_nope, q_pe, updated, w_uk, w_uv, *meta, attn,
                                                       f"layers.{i}.paged_attention", scale=cfg.softmax_scale))
    o = g.op("Reshape", attn, g.i64(-1, h * dv))
    return linear(g, rd, f"{p}.o_proj", o, hidden, h * dv, bias=cfg.attention_bias)


def dense_mlp(g: GraphBuilder, rd: CheckpointReader, prefix: str, x: str, hidden: int, inter: int, bias: bool) -> str:
    """down(silu(gate(x)) * up(x))."""
    gate = linear(g, rd, f"{prefix}.gate_proj", x, inter, hidden, bias=bias)
    up = linear(g, rd, f"{prefix}.up_proj", x, inter, hidden, bias=bias)
    act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
    return linear(g, rd, f"{prefix}.down_proj", act, hidden, inter, bias=bias)


def _group_mask(g: GraphBuilder, scores: str, n_exp: int, n_group: int, topk_group: int, group_score: str) -> str:
    """[T, E] bool: experts of the topk_group best groups (group score = top-2 sum for V3, max for V2)."""
    grouped = g.op("Reshape", scores, g.i64(-1, n_group, n_exp // n_group))
    if group_score == "top2_sum":
        top2 = g.op("TopK", grouped, g.i64(2), axis=-1, n_out=2)[0]
        gscore = g.op("ReduceSum", top2, g.i64(-1), keepdims=0)
    else:
        gscore = g.op("ReduceMax", grouped, g.i64(-1), keepdims=0)
    gidx = g.op("TopK", gscore, g.i64(topk_group), axis=-1, n_out=2)[1]  # [T, topk_group]
    ones = g.op("ConstantOfShape", g.op("Shape", gidx), value=_f32_value(1.0))
    zeros = g.op("ConstantOfShape", g.op("Shape", gscore), value=_f32_value(0.0))
    gmask = g.op("ScatterElements", zeros, gidx, ones, axis=1)  # [T, G]
    emask = g.op("Expand", g.op("Unsqueeze", gmask, g.i64(-1)), g.i64(1, 1, n_exp // n_group))
    return g.op("Cast", g.op("Reshape", emask, g.i64(-1, n_exp)), to=TensorProto.BOOL)


def _f32_value(v: float):
    from onnx import helper

    return helper.make_tensor("value", TensorProto.FLOAT, [1], [v])


def _router(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, prefix: str, x: str) -> tuple[str, str]:
    """(topk_weights [T, k] f32, topk_indices [T, k] i64) exactly as the model's TopkRouter."""
    moe, n_exp = cfg.moe, cfg.moe.n_routed_experts
    w = g.f32_tensor(f"{prefix}.gate.weight", rd.get(f"{prefix}.gate.weight", (n_exp, cfg.hidden_size)))
    logits = g.op("Gemm", x, w, transB=1)  # [T, E], f32 as transformers computes the router
    k = g.i64(moe.num_experts_per_tok)
    if moe.scoring == "sigmoid":  # DeepseekV3TopkRouter
        scores = g.op("Sigmoid", logits)
        bias = g.f32_tensor(f"{prefix}.gate.e_score_correction_bias",
                            rd.get(f"{prefix}.gate.e_score_correction_bias", (n_exp,)))
        choice = g.op("Add", scores, bias)
        if moe.topk_group < moe.n_group:  # with every group kept the mask is all true: skip it
            keep = _group_mask(g, choice, n_exp, moe.n_group, moe.topk_group, "top2_sum")
            choice = g.op("Where", keep, choice, g.f32(float("-inf")))
        idx = g.op("TopK", choice, k, axis=-1, n_out=2)[1]
        weights = g.op("GatherElements", scores, idx, axis=1)  # the un-biased scores weigh the experts
        if moe.norm_topk_prob:
            denom = g.op("Add", g.op("ReduceSum", weights, g.i64(-1), keepdims=1), g.f32(1e-20))
            weights = g.op("Div", weights, denom)
    else:  # DeepseekV2TopkRouter; it ignores norm_topk_prob in transformers 5.24, and so do we
        scores = g.op("Softmax", logits, axis=-1)
        if moe.topk_method == "group_limited_greedy" and moe.topk_group < moe.n_group:
            keep = _group_mask(g, scores, n_exp, moe.n_group, moe.topk_group, "max")
            scores = g.op("Where", keep, scores, g.f32(0.0))
        weights, idx = g.op("TopK", scores, k, axis=-1, n_out=2)
    return g.op("Mul", weights, g.f32(moe.routed_scaling_factor)), idx


def _expert_weights(rd: CheckpointReader, prefix: str, e: int, hidden: int, inter: int):
    """(gate [I, hidden], up [I, hidden], down [hidden, I]) of expert e in the checkpoint layout
    (one tensor per expert and projection, as DeepSeek's and save_pretrained's files hold them)."""
    per = f"{prefix}.experts.{e}"
    return (rd.get(f"{per}.gate_proj.weight", (inter, hidden)), rd.get(f"{per}.up_proj.weight", (inter, hidden)),
            rd.get(f"{per}.down_proj.weight", (hidden, inter)))


def moe(g: GraphBuilder, rd: CheckpointReader, cfg: MLAModelConfig, i: int, x: str) -> str:
    """Routed experts on their selected tokens only, plus the shared experts."""
    prefix = f"model.layers.{i}.mlp"
    hidden, inter, n_exp = cfg.hidden_size, cfg.moe.moe_intermediate_size, cfg.moe.n_routed_experts
    weights, idx = _router(g, rd, cfg, prefix, x)
    fused = None
    if not rd.has(f"{prefix}.experts.0.gate_proj.weight"):  # transformers' in-memory fused layout
        fused = (rd.get(f"{prefix}.experts.gate_up_proj", (n_exp, 2 * inter, hidden)),
                 rd.get(f"{prefix}.experts.down_proj", (n_exp, hidden, inter)))
    out = g.op("ConstantOfShape", g.op("Shape", x), value=_f32_value(0.0))
    for e in range(n_exp):
        if fused is None:
            w_gate, w_up, w_down = _expert_weights(rd, prefix, e, hidden, inter)
        else:
            w_gate, w_up, w_down = fused[0][e, :inter], fused[0][e, inter:], fused[1][e]
        # (token, slot) pairs that chose expert e, as transformers' torch.where(expert_mask[e]).
        hit = g.op("NonZero", g.op("Equal", idx, g.i64(e)))  # [2, N]
        tokens = g.op("Gather", hit, g.i64(0), axis=0)  # [1, N]
        coef = g.op("GatherND", weights, g.op("Transpose", hit, perm=[1, 0]))  # [N]
        xe = g.op("Gather", x, g.op("Squeeze", tokens, g.i64(0)), axis=0)  # [N, hidden]
        ep = f"{prefix}.experts.{e}"
        gate = g.op("Gemm", xe, g.weight(f"{ep}.gate_proj.weight", w_gate), transB=1)
        up = g.op("Gemm", xe, g.weight(f"{ep}.up_proj.weight", w_up), transB=1)
        act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
        y = g.op("Gemm", act, g.weight(f"{ep}.down_proj.weight", w_down), transB=1)
        y = g.op("Mul", y, g.op("Unsqueeze", coef, g.i64(1)))
        out = g.op("ScatterND", out, g.op("Transpose", tokens, perm=[1, 0]), y, reduction="add")
    if cfg.moe.n_shared_experts:
        shared = dense_mlp(g, rd, f"{prefix}.shared_experts", x, hidden, inter * cfg.moe.n_shared_experts, cfg.mlp_bias)
        out = g.op("Add", out, shared)
    return out
