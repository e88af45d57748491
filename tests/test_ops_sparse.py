"""DeepSeek Sparse Attention's two ops against the float64 reference (mla_export/ops/reference.py), in
both runtimes: MlaIndexerTopK (the lightning indexer's scores and top-k over a paged key cache) and
MlaPagedAttention with topk_indices (each token attends only to the positions it lists), in the
absorbed and the expanded form. Random problems from paged_problems: shuffled block tables, NaN in
every unowned cache row, varied lengths (prefill chunks past top-k, decode tokens, sequences
shorter than top-k); seeds printed by the `rng` fixture. Exactness in f32 (also on bf16/int8/fp8
caches: the reference reads the same stored values); then every input check."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.ops import kernels
from mla_export.ops import reference as R
from op_fronts import available_fronts
from paged_problems import make_problem, randn, rel_err

FRONTS = available_fronts()
RUNTIMES = [rt for rt, _ in FRONTS]
# (seq_len, qlen): a prefill past top-k, a chunk, decode tokens deep in the context, a short one
SHAPES = [(150, 150), (200, 37), (260, 1), (90, 1), (12, 12), (5, 1)]
HI, D, DR, TOPK = 8, 32, 16, 24


def _indexer_problem(rng, cache_dtype: str, shapes=SHAPES, block_size: int = 16):
    seq_lens, qlens = zip(*shapes)
    p = make_problem(rng, seq_lens, qlens, D, block_size, cache_dtype, r=D)
    t = int(p.query_start_loc[-1])
    q = randn(rng, (t, HI, D))
    w = randn(rng, (t, HI))
    return p, q, w


def _check_selection(got: np.ndarray, scores: list, topk: int, tol: float) -> None:
    """Each token's list: ascending, -1 only as padding, and the top-k of the reference scores up
    to near-ties (an f32 kernel may order two scores within `tol` of the k-th differently)."""
    for t, s in enumerate(scores):
        row = got[t]
        chosen = row[row >= 0]
        assert np.all(row[len(chosen):] == -1), f"token {t}: -1 must only pad the end: {row}"
        assert np.all(np.diff(chosen) > 0), f"token {t}: positions must be ascending and distinct: {row}"
        if len(s) <= topk:
            assert chosen.tolist() == list(range(len(s))), f"token {t} sees {len(s)} <= topk positions: all of them"
            continue
        assert len(chosen) == topk
        kth = np.sort(s)[::-1][topk - 1]
        slack = tol * max(1.0, abs(kth))
        others = np.setdiff1d(np.arange(len(s)), chosen)
        assert s[chosen].min() >= kth - slack and s[others].max() <= kth + slack, (
            f"token {t}: selection differs from the reference's top-{topk} beyond near-ties")


@pytest.mark.parametrize("cache_dtype", ["f32", "bf16", "f16", "int8", "fp8", "e5m2"])
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("threads", [1, 2])
def test_indexer_topk_matches_reference(rng, runtime, cache_dtype, threads):
    p, q, w = _indexer_problem(rng, cache_dtype)
    kv = None if cache_dtype == "f32" else cache_dtype
    got = kernels.indexer_topk(q, w, p.kv_cache, p.query_start_loc, p.seq_lens, p.block_tables, TOPK, kv,
                               runtime=runtime, num_threads=threads)
    assert got.dtype == np.int32 and got.shape == (q.shape[0], TOPK)
    scores = R.indexer_scores(q, w, p.kv_cache, p.query_start_loc, p.seq_lens, p.block_tables, kv)
    _check_selection(got, scores, TOPK, 1e-4)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_indexer_decode_split_across_threads_equals_one_thread(rng, runtime):
    """One decode token over a long context is scored in parts on several threads: the same
    selection as one thread's walk."""
    p, q, w = _indexer_problem(rng, "f32", shapes=[(3000, 1)], block_size=32)
    args = (q, w, p.kv_cache, p.query_start_loc, p.seq_lens, p.block_tables, 64)
    one = kernels.indexer_topk(*args, runtime=runtime, num_threads=1)
    two = kernels.indexer_topk(*args, runtime=runtime, num_threads=2)
    np.testing.assert_array_equal(one, two)
    _check_selection(one, R.indexer_scores(*args[:-1]), 64, 1e-4)


def _sparse_problem(rng, cache_dtype: str, topk: int, shapes=SHAPES):
    h, dn, r, dv = 4, 24, 64, 20
    seq_lens, qlens = zip(*shapes)
    p = make_problem(rng, seq_lens, qlens, r + DR, 16, cache_dtype, r=r)
    t = int(p.query_start_loc[-1])
    q_nope, q_pe = randn(rng, (t, h, dn)), randn(rng, (t, h, DR))
    w_uk, w_uv = randn(rng, (h, dn, r), scale=0.2), randn(rng, (h, r, dv), scale=0.2)
    # Each token: a random subset of the positions it sees (all of them when fewer), in random
    # order, padded with -1.
    idx = np.full((t, topk), -1, np.int32)
    for b, (length, qlen) in enumerate(shapes):
        for j in range(qlen):
            seen = length - qlen + j + 1
            pick = rng.choice(seen, min(topk, seen), replace=False)
            idx[p.query_start_loc[b] + j, :len(pick)] = pick
    return p, q_nope, q_pe, w_uk, w_uv, idx


@pytest.mark.parametrize("form", ["auto", "absorbed", "expanded"])
@pytest.mark.parametrize("cache_dtype", ["f32", "bf16", "int8", "fp8"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sparse_attention_matches_reference(rng, runtime, cache_dtype, form):
    p, qn, qp, wuk, wuv, idx = _sparse_problem(rng, cache_dtype, 40)
    kv = None if cache_dtype == "f32" else cache_dtype
    meta = (p.query_start_loc, p.seq_lens, p.block_tables)
    got = kernels.paged_attention(qn, qp, p.kv_cache, wuk, wuv, *meta, 0.125, form, kv, runtime=runtime,
                                  num_threads=2, topk_indices=idx)
    want = R.paged_attention_absorbed(qn, qp, p.kv_cache, wuk, wuv, *meta, 0.125, kv, topk_indices=idx)
    np.testing.assert_allclose(R.paged_attention_expanded(qn, qp, p.kv_cache, wuk, wuv, *meta, 0.125, kv,
                                                          topk_indices=idx), want, rtol=0, atol=1e-9)
    assert np.isfinite(got).all()
    assert rel_err(got, want) < 2e-5
    dense = R.paged_attention_absorbed(qn, qp, p.kv_cache, wuk, wuv, *meta, 0.125, kv)
    assert rel_err(dense, want) > 1e-2  # the selection matters: the test would catch a dense answer


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sparse_attention_with_every_position_listed_is_the_dense_attention(rng, runtime):
    """topk_indices that list every causal position give the dense causal attention."""
    shapes = [(60, 60), (80, 3)]
    p, qn, qp, wuk, wuv, _ = _sparse_problem(rng, "f32", 1, shapes)
    t = qn.shape[0]
    idx = np.full((t, 80), -1, np.int32)
    for b, (length, qlen) in enumerate(shapes):
        for j in range(qlen):
            seen = length - qlen + j + 1
            idx[p.query_start_loc[b] + j, :seen] = np.arange(seen)[::-1]
    meta = (p.query_start_loc, p.seq_lens, p.block_tables)
    dense = kernels.paged_attention(qn, qp, p.kv_cache, wuk, wuv, *meta, 0.1, runtime=runtime)
    for form in ("absorbed", "expanded"):
        sparse = kernels.paged_attention(qn, qp, p.kv_cache, wuk, wuv, *meta, 0.1, form, runtime=runtime,
                                         topk_indices=idx)
        assert rel_err(sparse, dense) < 1e-5, form


# ------------------------------------------------------------------------------ input checks

@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case, message", [
    ("beyond", r"outside \[0, 27\)"),
    ("negative", r"holds position -2"),
    ("duplicate", "twice for token"),
    ("empty", "selects no position"),
    ("rows", "dimension 0 must be"),
    ("float", "topk_indices.* must be (i32 or i64|int32 or int64)"),
])
def test_sparse_attention_rejects_bad_topk_indices(rng, runtime, case, message):
    p, qn, qp, wuk, wuv, idx = _sparse_problem(rng, "f32", 8, [(30, 4)])
    idx = idx.copy()
    if case == "beyond":
        idx[0, 0] = 27  # token 0 sits at position 26
    elif case == "negative":
        idx[1, 0] = -2
    elif case == "duplicate":
        idx[2, 1] = idx[2, 0]
    elif case == "empty":
        idx[3] = -1
    elif case == "rows":
        idx = idx[:3]
    elif case == "float":
        idx = idx.astype(np.float32)
    with pytest.raises(Exception, match=message):
        kernels.paged_attention(qn, qp, p.kv_cache, wuk, wuv, p.query_start_loc, p.seq_lens, p.block_tables, 0.1,
                                runtime=runtime, topk_indices=idx)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case, message", [
    ("weights_tokens", "input 'weights' dimension 0 must be"),
    ("weights_heads", "input 'weights' dimension 1 must be"),
    ("key_width", "must hold keys of"),
    ("seq_lens", "input 'seq_lens' holds"),
    ("query_start_loc", "input 'query_start_loc' must end at T"),
    ("topk", "attribute 'topk' must be >= 1"),
])
def test_indexer_rejects_bad_inputs(rng, runtime, case, message):
    p, q, w = _indexer_problem(rng, "f32", shapes=[(40, 5)])
    args = dict(q=q, weights=w, index_cache=p.kv_cache, query_start_loc=p.query_start_loc, seq_lens=p.seq_lens,
                block_tables=p.block_tables, topk=8)
    if case == "weights_tokens":
        args["weights"] = w[:3]
    elif case == "weights_heads":
        args["weights"] = w[:, :3]
    elif case == "key_width":
        args["q"] = np.ascontiguousarray(q[:, :, :16])
    elif case == "seq_lens":
        args["seq_lens"] = p.seq_lens + 1000
    elif case == "query_start_loc":
        args["query_start_loc"] = np.array([0, 4], np.int32)
    elif case == "topk":
        args["topk"] = 0
    runner = __import__(f"mla_export.ops.kernels_{runtime}", fromlist=["indexer_topk"])  # the op itself checks topk
    with pytest.raises(Exception, match=message):
        runner.indexer_topk(**args)


@pytest.mark.parametrize("cache_dtype", ["f32", "bf16", "f16", "fp8"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_indexer_bf16_products_select_within_bf16_rounding(rng, runtime, cache_dtype):
    """compute "bf16" (the runtime's bf16 hint): on AMX CPUs the scores multiply in bf16 with f32
    sums (indexer_amx.hpp; elsewhere the f32 path runs), so a selection may differ from the
    reference's only where two scores are within bf16 rounding of the k-th."""
    p, q, w = _indexer_problem(rng, cache_dtype, shapes=[(700, 40), (900, 1), (20, 20)])
    kv = None if cache_dtype == "f32" else cache_dtype
    got = kernels.indexer_topk(q, w, p.kv_cache, p.query_start_loc, p.seq_lens, p.block_tables, TOPK, kv,
                               runtime=runtime, num_threads=2, compute="bf16")
    scores = R.indexer_scores(q, w, p.kv_cache, p.query_start_loc, p.seq_lens, p.block_tables, kv)
    spread = max(float(np.abs(s).max()) for s in scores)
    _check_selection(got, [s / spread for s in scores], TOPK, 3e-2)
