"""Scheduler decisions on a real KVCacheManager, with the model step replaced by its bookkeeping:
after each step every request whose known tokens are all computed gets one more token."""

from __future__ import annotations

import numpy as np

from mla_export.runtime.kv_cache import KVCacheManager
from mla_export.runtime.request import Request, RequestStatus
from mla_export.runtime.sampling import SamplingParams
from mla_export.runtime.scheduler import Scheduler


def _setup(num_blocks=32, bs=4, max_seqs=8, budget=16, prefix=True):
    kv = KVCacheManager(num_blocks, bs, enable_prefix_caching=prefix, block_order_seed=0)
    return kv, Scheduler(kv, max_seqs, budget)


def _req(rid, n, start=0):
    return Request(rid, list(range(start, start + n)), SamplingParams(max_tokens=100), np.random.default_rng(0))


def _step(sched):
    out = sched.schedule()
    sched.update_after_step(out)
    for req, _ in out.scheduled:
        if req.num_computed_tokens == req.num_tokens:
            req.append_output(1000 + len(req.output_token_ids))
    return out


def _plan(out):
    return [(r.request_id, n) for r, n in out.scheduled]


def test_chunked_prefill_and_decodes_share_a_step():
    kv, sched = _setup(budget=8)
    sched.add(_req("a", 5))
    assert _plan(_step(sched)) == [("a", 5)]  # prompt fits; a gets its first token
    sched.add(_req("b", 20, start=100))
    # a decodes (1 token), b's prompt is cut to the remaining budget of 7, then 7, then 6.
    assert _plan(_step(sched)) == [("a", 1), ("b", 7)]
    assert _plan(_step(sched)) == [("a", 1), ("b", 7)]
    out = _step(sched)
    assert _plan(out) == [("a", 1), ("b", 6)]
    b = next(r for r, _ in out.scheduled if r.request_id == "b")
    assert b.output_token_ids == [1000] and b.num_computed_prompt_tokens == 20
    assert _plan(_step(sched)) == [("a", 1), ("b", 1)]


def test_max_num_seqs_bounds_the_running_set():
    kv, sched = _setup(max_seqs=2)
    for rid in "abc":
        sched.add(_req(rid, 3))
    assert _plan(_step(sched)) == [("a", 3), ("b", 3)]
    assert [r.request_id for r in sched.waiting] == ["c"]
    sched.finish(sched.running[0], "stop")
    assert _plan(_step(sched)) == [("b", 1), ("c", 3)]  # c joins as soon as a slot frees


def test_preemption_frees_the_newest_request_and_it_resumes_by_recompute():
    # 6 blocks of 4 rows: a (8 tokens) and b (8 tokens) take 2 blocks each, then grow.
    kv, sched = _setup(num_blocks=6, budget=64, prefix=False)
    sched.add(_req("a", 8))
    sched.add(_req("b", 8, start=50))
    _step(sched)
    for _ in range(20):  # a and b decode until the 6 blocks run out
        out = _step(sched)
        if out.preempted:
            break
    (victim,) = out.preempted
    assert victim.request_id == "b" and victim.status is RequestStatus.WAITING
    assert victim.num_computed_tokens == 0 and kv.block_table("b") == []
    assert list(sched.waiting) == [victim]
    tokens_before = list(victim.all_token_ids)
    # a keeps decoding alone until it finishes; then b is readmitted with its whole history.
    sched.finish(sched.running[0], "stop")
    out = _step(sched)
    assert _plan(out) == [("b", len(tokens_before))]
    assert victim.all_token_ids[: len(tokens_before)] == tokens_before
    assert victim.num_computed_prompt_tokens == 16  # its 8 prompt tokens, computed twice
    sched.finish(victim, "stop")
    assert kv.num_free_blocks == 6


def test_no_new_admissions_in_a_step_that_preempted():
    kv, sched = _setup(num_blocks=4, budget=64, prefix=False)
    sched.add(_req("a", 7))
    sched.add(_req("b", 8, start=50))
    _step(sched)  # a: 7 computed + 1 sampled, b: 8 + 1; 2 blocks each, so the cache is full
    sched.add(_req("c", 2, start=90))
    out = _step(sched)  # b needs a third block: none free -> b is preempted, c must wait
    assert [r.request_id for r in out.preempted] == ["b"]
    assert _plan(out) == [("a", 1)]
    assert [r.request_id for r in sched.waiting] == ["b", "c"]


def test_prefix_cache_hits_are_counted_at_admission():
    kv, sched = _setup(budget=64)
    sched.add(_req("a", 12))
    _step(sched)
    sched.add(_req("b", 14))  # shares a's first 12 tokens = 3 full blocks
    out = _step(sched)
    assert ("b", 2) in _plan(out)
    b = next(r for r, _ in out.scheduled if r.request_id == "b")
    assert b.num_cached_prompt_tokens == 12 and b.num_computed_prompt_tokens == 2
    assert (sched.prefix_cache_queries, sched.prefix_cache_hits) == (26, 12)


def test_a_fully_cached_prompt_gets_its_block_copy_in_the_step_output():
    # b's 8-token prompt is a's first 8 tokens (2 full blocks): its last token is recomputed
    # into a private copy of the second block, which the step hands out for the backend to copy.
    kv, sched = _setup(budget=64)
    sched.add(_req("a", 10))
    first = _step(sched)
    assert first.blocks_to_copy == []
    sched.add(_req("b", 8))
    out = _step(sched)
    assert ("b", 1) in _plan(out)
    shared = kv.block_table("a")[1]
    assert out.blocks_to_copy == [(shared, kv.block_table("b")[1])] and kv.block_table("b")[1] != shared
    assert kv.block_table("b")[0] == kv.block_table("a")[0]
    assert _step(sched).blocks_to_copy == []  # handed out once
