"""The reference math of every MLA op, in plain float64 numpy.

This module is the oracle: every kernel, graph and backend test compares against it. It is
written for reading, not speed: one sequence at a time, the cache rows of a sequence gathered
through its block table, the softmax written out. Inputs of any float dtype (including
ml_dtypes.bfloat16) are promoted to float64 first.

Conventions (see docs/MLA.md and docs/ARCHITECTURE.md):
- cache row = [kv_c (r) | k_pe (dr)], W = r + dr; V = the first r columns of the same rows.
- token i of a sequence lives in block block_tables[b, i // BS] at offset i % BS.
- new token j of sequence b (qlen_b new tokens) sits at position seq_lens[b] - qlen_b + j and
  attends to positions 0..itself.
- kv_dtype (every function that takes a cache): the row format (mla_export/formats/kv_formats.py);
  None = by the array's dtype (f32, bf16, f16). quantised caches are u8 [NB, BS, row bytes]:
  the write quantises exactly as the kernels do (in f32) and the reads dequantise in float64,
  so every kernel is compared with the same stored values.
"""

from __future__ import annotations

import numpy as np

from ..formats.kv_formats import QUANTISED, decode_rows, encode_rows, kv_dtype_of


def _format(kv_cache, kv_dtype: str | None) -> str:
    """The cache's row format; without kv_dtype any float array is read as its values."""
    if kv_dtype is None and np.asarray(kv_cache).dtype != np.uint8:
        return "f32"  # plain values (f32, bf16, f16, f64 alike): promoted to float64
    return kv_dtype_of(np.asarray(kv_cache), kv_dtype)

__all__ = [
    "cache_write",
    "gather_sequence_rows",
    "paged_decode",
    "paged_attention_absorbed",
    "paged_attention_expanded",
    "absorb_query",
    "sparse_mask",
    "indexer_scores",
    "indexer_topk",
    "moe_experts",
]


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def cache_write(kv_c, k_pe, kv_cache: np.ndarray, slot_mapping, kv_dtype: str | None = None) -> np.ndarray:
    """Write row [kv_c[t] | k_pe[t]] at slot_mapping[t] (skipping slots < 0), in place."""
    fmt = _format(kv_cache, kv_dtype)
    nb, bs, width = kv_cache.shape
    if fmt in QUANTISED:  # quantised from f32, as the kernel converts its inputs first
        rows = encode_rows(np.concatenate([np.asarray(kv_c).astype(np.float32), np.asarray(k_pe).astype(np.float32)],
                                          axis=1), fmt, np.asarray(kv_c).shape[1])
    else:
        rows = np.concatenate([_f64(kv_c), _f64(k_pe)], axis=1)
    assert rows.shape[1] == width, "kv_c and k_pe widths must add up to the cache row width"
    flat = kv_cache.reshape(nb * bs, width)  # a view: writes land in kv_cache
    for t, slot in enumerate(np.asarray(slot_mapping).tolist()):
        if slot >= 0:
            flat[slot] = rows[t].astype(kv_cache.dtype)
    return kv_cache


def gather_sequence_rows(kv_cache, block_table_row, length: int, kv_dtype: str | None = None,
                         r: int | None = None) -> np.ndarray:
    """The first `length` cache rows of one sequence, in token order, as float64 [length, W]
    (r, the latent rank, is needed for quantised rows)."""
    fmt = _format(kv_cache, kv_dtype)
    bs = kv_cache.shape[1]
    idx = np.arange(length)
    blocks = np.asarray(block_table_row)[idx // bs]
    return decode_rows(kv_cache[blocks, idx % bs], fmt, r)


def _softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def _causal_mask(qlen: int, seq_len: int) -> np.ndarray:
    """[qlen, seq_len] bool: new token j (position seq_len - qlen + j) sees positions <= its own."""
    pos = seq_len - qlen + np.arange(qlen)
    return np.arange(seq_len)[None, :] <= pos[:, None]


def paged_decode(q, kv_cache, block_tables, seq_lens, scale: float, kv_lora_rank: int,
                 kv_dtype: str | None = None) -> np.ndarray:
    """Absorbed MQA decode, vLLM mla_decode_kvcache semantics.

    q [B, H, W] (already [q_nope @ W_UK | q_pe]); returns [B, H, r] float64, r = kv_lora_rank:
    scores over all W columns of each cached row, values = the row's first r columns.
    """
    q = _f64(q)
    b_count, h_count, _ = q.shape
    out = np.zeros((b_count, h_count, kv_lora_rank))
    for b in range(b_count):
        rows = gather_sequence_rows(kv_cache, block_tables[b], int(seq_lens[b]), kv_dtype, kv_lora_rank)  # [L, W]
        probs = _softmax((q[b] @ rows.T) * scale)  # [H, L]
        out[b] = probs @ rows[:, :kv_lora_rank]
    return out


def absorb_query(q_nope, q_pe, w_uk) -> np.ndarray:
    """[q_nope @ W_UK | q_pe]: q_nope [T, H, dn], w_uk [H, dn, r], q_pe [T, H, dr] -> [T, H, r + dr]."""
    q_lat = np.einsum("thd,hdr->thr", _f64(q_nope), _f64(w_uk))
    return np.concatenate([q_lat, _f64(q_pe)], axis=-1)


def _sequences(query_start_loc, seq_lens):
    """(b, first packed row, qlen, seq_len) for each sequence of the batch."""
    qsl = np.asarray(query_start_loc).tolist()
    for b, seq_len in enumerate(np.asarray(seq_lens).tolist()):
        yield b, qsl[b], qsl[b + 1] - qsl[b], seq_len


def sparse_mask(topk_indices, start: int, qlen: int, seq_len: int) -> np.ndarray:
    """[qlen, seq_len] bool: causal, and (with topk_indices [T, K]) only the positions token
    start + j lists (-1 = none)."""
    mask = _causal_mask(qlen, seq_len)
    if topk_indices is None:
        return mask
    chosen = np.zeros_like(mask)
    for j, row in enumerate(np.asarray(topk_indices)[start:start + qlen].tolist()):
        chosen[j, [p for p in row if p >= 0]] = True
    return mask & chosen


def paged_attention_absorbed(q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens,
                             block_tables, scale: float, kv_dtype: str | None = None,
                             topk_indices=None) -> np.ndarray:
    """Causal paged MLA over packed new tokens, absorbed form. Returns [T, H, dv] float64.

    Scores are q576 . row over the whole latent row; values are the first r columns; the
    latent output is up-projected per head by w_uv [H, r, dv]. topk_indices [T, K]: sparse
    attention, each token sees only the positions it lists.
    """
    w_uv = _f64(w_uv)
    r = w_uv.shape[1]
    q576 = absorb_query(q_nope, q_pe, w_uk)  # [T, H, W]
    out = np.zeros((q576.shape[0], q576.shape[1], w_uv.shape[2]))
    for b, start, qlen, seq_len in _sequences(query_start_loc, seq_lens):
        if qlen == 0:
            continue
        rows = gather_sequence_rows(kv_cache, block_tables[b], seq_len, kv_dtype, r)  # [L, W]
        scores = np.einsum("thw,lw->htl", q576[start:start + qlen], rows) * scale
        scores = np.where(sparse_mask(topk_indices, start, qlen, seq_len)[None], scores, -np.inf)
        o_lat = _softmax(scores) @ rows[:, :r]  # [H, qlen, r]
        out[start:start + qlen] = np.einsum("htr,hrv->thv", o_lat, w_uv)
    return out


def paged_attention_expanded(q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens,
                             block_tables, scale: float, kv_dtype: str | None = None,
                             topk_indices=None) -> np.ndarray:
    """The same attention in the expanded (up-projected) form: per-head K = [W_UK kv_c | k_pe],
    V = kv_c @ W_UV, ordinary causal multi-head attention. Returns [T, H, dv] float64."""
    q_nope, q_pe, w_uk, w_uv = _f64(q_nope), _f64(q_pe), _f64(w_uk), _f64(w_uv)
    r = w_uv.shape[1]
    out = np.zeros((q_nope.shape[0], q_nope.shape[1], w_uv.shape[2]))
    for b, start, qlen, seq_len in _sequences(query_start_loc, seq_lens):
        if qlen == 0:
            continue
        rows = gather_sequence_rows(kv_cache, block_tables[b], seq_len, kv_dtype, r)
        kv_c, k_pe = rows[:, :r], rows[:, r:]
        k_nope = np.einsum("hdr,lr->hld", w_uk, kv_c)  # [H, L, dn]
        v = np.einsum("lr,hrv->hlv", kv_c, w_uv)  # [H, L, dv]
        qn = q_nope[start:start + qlen].transpose(1, 0, 2)  # [H, qlen, dn]
        qp = q_pe[start:start + qlen].transpose(1, 0, 2)  # [H, qlen, dr]
        scores = (qn @ k_nope.transpose(0, 2, 1) + qp @ k_pe.T[None]) * scale  # [H, qlen, L]
        scores = np.where(sparse_mask(topk_indices, start, qlen, seq_len)[None], scores, -np.inf)
        out[start:start + qlen] = (_softmax(scores) @ v).transpose(1, 0, 2)
    return out


def indexer_scores(q, weights, index_cache, query_start_loc, seq_lens, block_tables,
                   kv_dtype: str | None = None) -> list[np.ndarray]:
    """DeepSeek Sparse Attention's indexer scores, float64: for each new token t (position p) the
    vector [p + 1] of sum_h weights[t, h] * relu(q[t, h] . key[s]) over the positions s <= p it sees.
    q [T, Hi, D], weights [T, Hi], index_cache rows of D values ([kv_c] only: dr = 0)."""
    q, w = _f64(q), _f64(weights)
    out = [None] * q.shape[0]
    for b, start, qlen, seq_len in _sequences(query_start_loc, seq_lens):
        keys = gather_sequence_rows(index_cache, block_tables[b], seq_len, kv_dtype, q.shape[2])  # [L, D]
        for j in range(qlen):
            t, p = start + j, seq_len - qlen + j
            out[t] = (w[t][:, None] * np.maximum(q[t] @ keys[:p + 1].T, 0.0)).sum(axis=0)
    return out


def indexer_topk(q, weights, index_cache, query_start_loc, seq_lens, block_tables, topk: int,
                 kv_dtype: str | None = None) -> np.ndarray:
    """[T, topk] int32: each token's topk positions of largest indexer score (ties: the earlier
    position), ascending; a token that sees at most topk positions lists them all, then -1."""
    scores = indexer_scores(q, weights, index_cache, query_start_loc, seq_lens, block_tables, kv_dtype)
    out = np.full((len(scores), topk), -1, np.int32)
    for t, s in enumerate(scores):
        chosen = np.sort(np.argsort(-s, kind="stable")[:topk])
        out[t, :len(chosen)] = chosen
    return out


def q8_block(group: int) -> int:
    """The activation block of the int8-activation path for a weight group (qmatmul: QRow)."""
    return 128 if group % 128 == 0 else 64 if group % 64 == 0 else 32


def q8_activations(x, block: int) -> np.ndarray:
    """Activation rows as the integer-weight ops see them in their reduced-precision mode on AVX2
    and AVX-512 VNNI CPUs (qgemm.hpp, QRow): each block of `block` inputs scaled by d = max|x| / 127 and rounded
    to int8 codes. Returns d * codes, float64, same shape. The codes are computed in f32 exactly as
    the kernels compute them (x * (127 / max|x|), rounded half to even): a float64 division lands
    on the other side of a .5 now and then (one code in ~1e5), which is not an error of either."""
    x = np.asarray(x, dtype=np.float32)
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // block, block))
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    codes = np.clip(np.rint(blocks * inv), -127, 127).astype(np.float64)
    d = (amax / np.float32(127)).astype(np.float64)
    return (codes * d).reshape(x.shape)


def linear(x, w, q8_group: int | None = None) -> np.ndarray:
    """MlaQLinear: x [..., K] @ w[N, K]^T (w given already dequantised), float64; q8_group: the
    weight group of the int8-activation path (activations as q8_activations leaves them)."""
    x = q8_activations(x, q8_block(q8_group)) if q8_group else _f64(x)
    return x @ _f64(w).T


def moe_experts(x, topk_ids, topk_weights, w13, w2, q8_groups: tuple[int, int] | None = None) -> np.ndarray:
    """The routed experts of one MoE layer (MlaMoeExperts): for each token t and slot j, expert
    e = topk_ids[t, j] computes down_e(silu(gate_e(x_t)) * up_e(x_t)) with gate/up the rows [0, I)
    and [I, 2I) of w13[e] [2I, H] and down = w2[e] [H, I]; the results are summed with weights
    topk_weights[t, j]. Returns [T, H] float64 (weights given already dequantised). q8_groups: the
    weight groups (w13, w2) of the int8-activation path: both products' activations (x, and
    silu(gate) * up) as q8_activations leaves them."""
    x, w13, w2, wts = _f64(x), _f64(w13), _f64(w2), _f64(topk_weights)
    if q8_groups:
        x = q8_activations(x, q8_block(q8_groups[0]))
    inter = w13.shape[1] // 2
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(np.asarray(topk_ids)[t]):
            h = w13[e] @ x[t]
            gate, up = h[:inter], h[inter:]
            act = gate / (1.0 + np.exp(-gate)) * up
            if q8_groups:
                act = q8_activations(act, q8_block(q8_groups[1]))
            out[t] += wts[t, j] * (w2[e] @ act)
    return out
