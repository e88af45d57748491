"""DeepSeek-V3's multi-token-prediction (MTP) module in plain float64 numpy: the oracle of the
exported MTP draft graph (transformers has no MTP code to compare with), for V3's block and for the
DeepSeek Sparse Attention block of V3.2 and GLM-5.

The math, from the V3 technical report (section 2.2) and vLLM's deepseek_mtp (which serves the
released checkpoints): the MTP layer at position i takes the main model's last hidden state h_i
(before the final norm) and the embedding of the next token t_{i+1}:

    e   = embed(t_{i+1}), zeroed where the position is 0 (vLLM: "not needed by MTP")
    x   = eh_proj(concat(enorm(e), hnorm(h_i)))          # [H] <- [2H]: embedding half first
    h'  = decoder layer (MLA attention at position i over the MTP layer's own cache, then MoE)
    p   = shared_head.head(shared_head.norm(h'))          # logits of t_{i+2}

h' is what a further draft step feeds back as its "h". Weights are read under the checkpoint's
names, model.layers.<N>.* with N = num_hidden_layers; the embedding is the model's own (a
checkpoint may store a copy as model.layers.<N>.embed_tokens.weight: then that one).

The decoder layer is written out here too (MLA attention in its expanded form, V3's sigmoid
router with groups, shared experts), one sequence at a time, every position attending to
positions 0..itself; with sparse attention (cfg.sparse) only to the index_topk of them its
lightning indexer picks (transformers' DeepseekV32Indexer; a GLM-5 "shared" layer reuses the
previous full layer's pick). The MTP layer of those models runs its own indexer (its checkpoint
holds model.layers.<N>.self_attn.indexer.*; vLLM gives it its own key cache). The RoPE
frequencies and YaRN factors come from MLAModelConfig (position x inv_freq in float32, as
transformers computes it); everything after is float64. The same layer function runs the main
model's layers (`main_forward`), which the tests check against transformers, so the block is
validated where an outside oracle exists.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..checkpoint.config import MLAModelConfig

__all__ = ["rms_norm", "decoder_layer", "main_forward", "mtp_forward", "mtp_layer_index", "Weights"]

Weights = Callable[[str], np.ndarray]  # tensor name -> its values (any float dtype)


def _w(get: Weights, name: str) -> np.ndarray:
    return np.asarray(get(name), dtype=np.float64)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def mtp_layer_index(cfg: MLAModelConfig, j: int = 0) -> int:
    """Where the checkpoint keeps MTP layer j: right after the last decoder layer."""
    return cfg.num_layers + j


def _rope(x: np.ndarray, positions: np.ndarray, cfg: MLAModelConfig, form: str | None = None) -> np.ndarray:
    """x [T, ..., dr] rotated at `positions` [T]; V3's interleaved pairs become rotate-half after
    the de-interleave permutation (transformers' apply_rotary_pos_emb_interleave does the same).
    form: the layout (default the main attention's, cfg.rope_form; the indexer has its own)."""
    dr = x.shape[-1]
    form = form or cfg.rope_form
    if form == "interleave":
        x = x[..., np.concatenate([np.arange(0, dr, 2), np.arange(1, dr, 2)])]
    elif form != "half":
        raise ValueError(f"the MTP reference covers V3's RoPE forms (interleave, half), not {form!r}")
    freqs = (positions.astype(np.float32)[:, None] * cfg.rope.inv_freq()[None, :]).astype(np.float32)
    scale = cfg.rope.cos_sin_scaling()
    cos = np.cos(freqs.astype(np.float64)) * scale
    sin = np.sin(freqs.astype(np.float64)) * scale
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (dr // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    a, b = x[..., :dr // 2], x[..., dr // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _indexer_pick(x: np.ndarray, qa: np.ndarray, get: Weights, cfg: MLAModelConfig, p: str,
                  positions: np.ndarray) -> np.ndarray:
    """[T, T] bool: the positions the lightning indexer (weights under `p`.indexer) lets each token
    attend to: the index_topk visible ones of largest score (all of them when fewer are visible;
    ties: the earlier position). score[t, s] = sum_h w[t, h] * Hi^-0.5 * relu(q[t, h] . k[s] * D^-0.5)
    with q = wq_b(qa), k = LayerNorm(wk(x)), RoPE (the indexer's own layout) on the first
    qk_rope_head_dim values of both, w = weights_proj(x)."""
    sp, ip = cfg.sparse, f"{p}.indexer"
    hi, d, dr = sp.index_n_heads, sp.index_head_dim, cfg.qk_rope_head_dim
    q = (qa @ _w(get, f"{ip}.wq_b.weight").T).reshape(len(x), hi, d)
    k = x @ _w(get, f"{ip}.wk.weight").T
    k = (k - k.mean(-1, keepdims=True)) / np.sqrt(k.var(-1, keepdims=True) + 1e-6)  # nn.LayerNorm(D, eps=1e-6)
    k = k * _w(get, f"{ip}.k_norm.weight") + _w(get, f"{ip}.k_norm.bias")
    q = np.concatenate([_rope(q[..., :dr], positions, cfg, sp.rope_form), q[..., dr:]], axis=-1)
    k = np.concatenate([_rope(k[..., :dr], positions, cfg, sp.rope_form), k[..., dr:]], axis=-1)
    w = (x @ _w(get, f"{ip}.weights_proj.weight").T) * hi ** -0.5
    score = np.einsum("th,ths->ts", w, np.maximum(np.einsum("thd,sd->ths", q, k) * d ** -0.5, 0.0))
    visible = positions[None, :] <= positions[:, None]
    score = np.where(visible, score, -np.inf)
    picked = np.zeros_like(visible)
    for t in range(len(x)):
        chosen = np.argsort(-score[t], kind="stable")[:min(sp.index_topk, int(visible[t].sum()))]
        picked[t, chosen] = True
    return picked


def _attention(x: np.ndarray, get: Weights, cfg: MLAModelConfig, p: str, positions: np.ndarray, i: int = 0,
               state: dict | None = None) -> np.ndarray:
    """MLA self-attention of one sequence x [T, H] at positions [T] (causal by position) of layer i;
    sparse attention: only to the positions the indexer picks (state["picked"] carries a full
    layer's pick to the "shared" layers after it; a layer past the model's, the MTP layer, is full)."""
    h, dn, dr, dv, r = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if cfg.q_lora_rank is None:
        q = x @ _w(get, f"{p}.q_proj.weight").T
    else:
        qa = rms_norm(x @ _w(get, f"{p}.q_a_proj.weight").T, _w(get, f"{p}.q_a_layernorm.weight"), 1e-6)
        q = qa @ _w(get, f"{p}.q_b_proj.weight").T
    q = q.reshape(-1, h, dn + dr)
    q_nope, q_pe = q[..., :dn], _rope(q[..., dn:], positions, cfg)
    ckv = x @ _w(get, f"{p}.kv_a_proj_with_mqa.weight").T
    kv_c = rms_norm(ckv[:, :r], _w(get, f"{p}.kv_a_layernorm.weight"), 1e-6)
    k_pe = _rope(ckv[:, r:], positions, cfg)  # [T, dr], shared by every head
    kv = (kv_c @ _w(get, f"{p}.kv_b_proj.weight").T).reshape(-1, h, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    scores = (np.einsum("thd,shd->hts", q_nope, k_nope) + np.einsum("thd,sd->hts", q_pe, k_pe)) * cfg.softmax_scale
    allowed = positions[None, :] <= positions[:, None]
    if cfg.sparse:
        types = cfg.sparse.indexer_types
        if i < len(types) and types[i] == "shared":
            allowed = state["picked"]
        else:
            allowed = _indexer_pick(x, qa, get, cfg, p, positions)
            if state is not None:
                state["picked"] = allowed
    scores = np.where(allowed[None], scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    out = np.einsum("hts,shd->thd", probs, v).reshape(-1, h * dv)
    return out @ _w(get, f"{p}.o_proj.weight").T


def _mlp(x: np.ndarray, get: Weights, p: str) -> np.ndarray:
    gate, up = x @ _w(get, f"{p}.gate_proj.weight").T, x @ _w(get, f"{p}.up_proj.weight").T
    return (gate / (1.0 + np.exp(-gate)) * up) @ _w(get, f"{p}.down_proj.weight").T


def _moe(x: np.ndarray, get: Weights, cfg: MLAModelConfig, p: str) -> np.ndarray:
    """V3's MoE: sigmoid scores, the correction bias only to choose, top-2-sum groups, the chosen
    experts' un-biased scores (renormalised when norm_topk_prob) times routed_scaling_factor,
    plus the shared experts."""
    moe = cfg.moe
    if moe is None or moe.scoring != "sigmoid":
        raise ValueError("the MTP reference covers DeepSeek-V3's sigmoid router only")
    n_exp, k = moe.n_routed_experts, moe.num_experts_per_tok
    scores = 1.0 / (1.0 + np.exp(-(x @ _w(get, f"{p}.gate.weight").T)))
    choice = scores + _w(get, f"{p}.gate.e_score_correction_bias")
    grouped = choice.reshape(len(x), moe.n_group, n_exp // moe.n_group)
    group_score = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
    kept = np.argsort(-group_score, axis=-1, kind="stable")[:, :moe.topk_group]
    mask = np.zeros_like(group_score, dtype=bool)
    np.put_along_axis(mask, kept, True, axis=-1)
    choice = np.where(np.repeat(mask, n_exp // moe.n_group, axis=-1), choice, -np.inf)
    idx = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(scores, idx, axis=-1)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    weights = weights * moe.routed_scaling_factor
    out = np.zeros_like(x)
    for t in range(len(x)):
        for e, wt in zip(idx[t], weights[t]):
            out[t] += wt * _mlp(x[t:t + 1], get, f"{p}.experts.{e}")[0]
    if moe.n_shared_experts:
        out += _mlp(x, get, f"{p}.shared_experts")
    return out


def decoder_layer(h: np.ndarray, get: Weights, cfg: MLAModelConfig, i: int, positions: np.ndarray,
                  state: dict | None = None) -> np.ndarray:
    """Decoder layer i (weights model.layers.<i>.*) on one sequence's hidden states [T, H]. Its MLP
    is a MoE block when the checkpoint holds a router for it (the MTP layer is not in config's
    per-layer dense/MoE list), else dense. state: what passes between the layers of one forward
    (a sparse model's last indexer pick, for its shared layers)."""
    p, eps = f"model.layers.{i}", cfg.rms_norm_eps
    h = h + _attention(rms_norm(h, _w(get, f"{p}.input_layernorm.weight"), eps), get, cfg, f"{p}.self_attn",
                       positions, i, state)
    x = rms_norm(h, _w(get, f"{p}.post_attention_layernorm.weight"), eps)
    try:
        get(f"{p}.mlp.gate.weight")
        is_moe = True
    except (KeyError, ValueError):  # CheckpointReader's WeightError is a ValueError
        is_moe = False
    return h + (_moe(x, get, cfg, f"{p}.mlp") if is_moe else _mlp(x, get, f"{p}.mlp"))


def _embed(get: Weights, names: tuple[str, ...], tokens) -> np.ndarray:
    for name in names:
        try:
            table = get(name)
        except (KeyError, ValueError):
            continue
        return np.asarray(table, dtype=np.float64)[np.asarray(tokens)]
    raise KeyError(f"no embedding table among {names}")


def main_forward(tokens, get: Weights, cfg: MLAModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """The main model on one sequence: (last hidden states [T, H] before the final norm, logits [T, V])."""
    positions = np.arange(len(tokens))
    h = _embed(get, ("model.embed_tokens.weight",), tokens)
    state: dict = {}
    for i in range(cfg.num_layers):
        h = decoder_layer(h, get, cfg, i, positions, state)
    return h, rms_norm(h, _w(get, "model.norm.weight"), cfg.rms_norm_eps) @ _w(get, "lm_head.weight").T


def mtp_forward(next_tokens, hidden: np.ndarray, positions, get: Weights, cfg: MLAModelConfig,
                j: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """MTP layer j on one sequence: next_tokens[t] = t_{i+1}, hidden[t] = h_i (the main model's,
    or the previous MTP step's h'), positions[t] = i, in order from 0 (each row attends to the
    rows before it). Returns (h' [T, H], logits [T, V])."""
    n = mtp_layer_index(cfg, j)
    p, eps = f"model.layers.{n}", cfg.rms_norm_eps
    positions = np.asarray(positions)
    e = _embed(get, (f"{p}.embed_tokens.weight", "model.embed_tokens.weight"), next_tokens)
    e = np.where((positions == 0)[:, None], 0.0, e)
    x = np.concatenate([rms_norm(e, _w(get, f"{p}.enorm.weight"), eps),
                        rms_norm(np.asarray(hidden, np.float64), _w(get, f"{p}.hnorm.weight"), eps)], axis=-1)
    h = decoder_layer(x @ _w(get, f"{p}.eh_proj.weight").T, get, cfg, n, positions)
    logits = rms_norm(h, _w(get, f"{p}.shared_head.norm.weight"), eps) @ _w(get, f"{p}.shared_head.head.weight").T
    return h, logits
