"""The kernels' work split across threads, and the per-sequence form choice.

With more than one thread a long sequence's context is cut into splits whose partial softmax
states are merged by log-sum-exp (latent_attention.cpp, plan_splits): a path no single-thread
run reaches. Every case runs at 1 and 2 threads on each runtime's front, f32 throughout, against
the float64 reference; the 2-thread result must also differ in its last bits from the 1-thread
one, which shows the split (another summation order) really ran.

`choose_form` (auto form) is asserted through its results: for each sequence the auto output is
bit-identical to the output of the form the cost model below picks (a restatement of
latent_attention.cpp's choose_form: multiply-adds of each form per sequence).
"""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.ops import reference as ref
from op_fronts import available_fronts
from paged_problems import make_problem, randn, rel_err

TOL = 2e-5  # f32 accumulation against float64
FRONTS = dict(available_fronts())


@pytest.mark.parametrize("runtime", list(FRONTS))
def test_decode_split_across_threads_matches_reference(rng, runtime):
    ops = FRONTS[runtime]
    h, r, dr, bs = 4, 64, 16, 16
    p = make_problem(rng, [3000, 7], [1, 1], r + dr, bs)
    q = randn(rng, (2, h, r + dr))
    expected = ref.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, 0.1, kv_lora_rank=r)
    outs = {}
    for threads in (1, 2):
        outs[threads] = ops.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, 0.1, r, num_threads=threads)
        assert rel_err(outs[threads], expected) <= TOL, f"{threads} threads"
    assert not np.array_equal(outs[1], outs[2]), "2 threads gave the 1-thread bits: the context was not split"


@pytest.mark.parametrize("runtime", list(FRONTS))
def test_attention_split_across_threads_matches_reference(rng, runtime):
    ops = FRONTS[runtime]
    h, dn, dr, r, dv, bs = 3, 24, 16, 32, 20, 16
    p = make_problem(rng, [2000, 40], [2, 40], r + dr, bs)  # a long-context absorbed chunk and a prefill
    t = int(p.qlens.sum())
    q_nope, q_pe = randn(rng, (t, h, dn)), randn(rng, (t, h, dr))
    w_uk, w_uv = randn(rng, (h, dn, r), scale=dn ** -0.5), randn(rng, (h, r, dv), scale=r ** -0.5)
    args = (q_nope, q_pe, p.kv_cache, w_uk, w_uv, p.query_start_loc, p.seq_lens, p.block_tables, 0.2)
    expected = ref.paged_attention_absorbed(*args)
    outs = {}
    for threads in (1, 2):
        outs[threads] = ops.paged_attention(*args, form="absorbed", num_threads=threads)
        assert rel_err(outs[threads], expected) <= TOL, f"{threads} threads"
    assert not np.array_equal(outs[1][:2], outs[2][:2]), "2 threads gave the 1-thread bits: the context was not split"


def choose_form(qlen: int, seq_len: int, h: int, r: int, dr: int, dn: int, dv: int) -> str:
    pairs = qlen * (seq_len - qlen) + qlen * (qlen + 1) / 2
    absorbed = qlen * h * (dn * r + r * dv) + pairs * h * (2 * r + dr)
    expanded = seq_len * h * (dn + dv) * r + pairs * h * (dn + dr + dv)
    return "expanded" if expanded < absorbed else "absorbed"


@pytest.mark.parametrize("runtime", list(FRONTS))
def test_auto_form_runs_the_form_the_cost_model_picks(rng, runtime):
    ops = FRONTS[runtime]
    h, dn, dr, r, dv, bs = 3, 24, 16, 32, 20, 8
    cases = [(1, 100), (30, 100), (64, 64), (9, 9), (4, 700)]  # (qlen, seq_len)
    picks = [choose_form(q, s, h, r, dr, dn, dv) for q, s in cases]
    assert set(picks) == {"absorbed", "expanded"}  # both branches of the choice are exercised
    for (qlen, seq_len), pick in zip(cases, picks):
        p = make_problem(rng, [seq_len], [qlen], r + dr, bs)
        q_nope, q_pe = randn(rng, (qlen, h, dn)), randn(rng, (qlen, h, dr))
        w_uk, w_uv = randn(rng, (h, dn, r), scale=dn ** -0.5), randn(rng, (h, r, dv), scale=r ** -0.5)
        args = (q_nope, q_pe, p.kv_cache, w_uk, w_uv, p.query_start_loc, p.seq_lens, p.block_tables, 0.2)
        out = {form: ops.paged_attention(*args, form=form, num_threads=1) for form in ("auto", "absorbed", "expanded")}
        other = "expanded" if pick == "absorbed" else "absorbed"
        assert not np.array_equal(out[pick], out[other]), "the two forms agree bit for bit: the case cannot tell"
        assert np.array_equal(out["auto"], out[pick]), f"qlen {qlen}, seq_len {seq_len}: auto did not run {pick}"
