"""The engine at its seams: a fully cached prompt on an exactly full cache runs; a request the
graph rejects fails alone (finish_reason "error") and the engine serves the rest and later
requests; numpy prompts work in LLM.generate. f32 caches, f32 inference."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.runtime import LLM, LLMEngine, SamplingParams

BS = 4


@pytest.fixture(scope="module")
def out_dir(exports):
    return exports.model("deepseek_v3", "f32", BS)[1]


def _run(engine, prompts: dict, params) -> dict:
    for rid, p in prompts.items():
        engine.add_request(rid, p, params)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


def test_fully_cached_prompt_on_an_exactly_full_cache(out_dir):
    prompt = list(range(10, 10 + 2 * BS))  # two full blocks
    engine = LLMEngine(out_dir, precision="f32", num_blocks=2)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    first = _run(engine, {"a": prompt}, params)["a"]
    again = _run(engine, {"b": prompt}, params)["b"]  # every block cached; the last must be rewritten
    assert again.finish_reason == "length" and again.token_ids == first.token_ids
    assert again.metrics.num_cached_prompt_tokens == len(prompt) - 1
    assert engine.stats()["kv_blocks_free"] == 2


def test_a_rejected_request_fails_alone(out_dir, monkeypatch):
    engine = LLMEngine(out_dir, precision="f32", num_blocks=32)
    params = SamplingParams(max_tokens=3, temperature=0.0)
    alone = _run(engine, {"ref": [5, 6, 7]}, params)["ref"]
    # A request whose token ids the graph refuses (past the vocab) although add_request
    # accepted them: the graph's step check rejects the batch, the engine finds the culprit.
    vocab = engine.facts.vocab_size
    engine.add_request("bad", [1, 2, 3], params)
    engine._requests["bad"].all_token_ids[1] = vocab + 7  # noqa: SLF001 - corrupt it after admission
    final = _run(engine, {"good": [5, 6, 7]}, params)
    assert final["bad"].finish_reason == "error" and "token id" in final["bad"].error
    assert final["good"].finish_reason == "length" and final["good"].token_ids == alone.token_ids
    assert engine.stats()["kv_blocks_used"] == 0
    later = _run(engine, {"later": [5, 6, 7]}, params)["later"]  # the engine still serves
    assert later.token_ids == alone.token_ids


def test_request_that_can_never_be_scheduled_fails_alone(out_dir):
    engine = LLMEngine(out_dir, precision="f32", num_blocks=4)
    params = SamplingParams(max_tokens=2, temperature=0.0)
    engine.add_request("big", list(range(1, 4 * BS + 1)), SamplingParams(max_tokens=1, temperature=0.0))
    engine.kv_cache.pool.allocate(1)  # a block lost to the pool: "big" cannot fit any more
    out = engine.step()
    assert [o.finish_reason for o in out] == ["error"] and "cannot be scheduled" in out[0].error
    assert not engine.has_unfinished_requests()


@pytest.fixture(scope="module")
def llm(out_dir):
    return LLM(out_dir, precision="f32", num_blocks=16)


@pytest.mark.parametrize("make", [
    lambda: np.array([5, 6, 7]),
    lambda: np.array([5, 6, 7], dtype=np.int32),
    lambda: [np.int64(5), np.int64(6), np.int64(7)],
    lambda: np.array([[5, 6, 7], [5, 6, 7]]),
    lambda: [np.array([5, 6, 7]), [5, 6, 7]],
])
def test_numpy_prompts(llm, make):
    outs = llm.generate(make(), max_tokens=2, temperature=0.0)
    ref = llm.generate([5, 6, 7], max_tokens=2, temperature=0.0)[0]
    assert all(o.token_ids == ref.token_ids and o.prompt_token_ids == [5, 6, 7] for o in outs)


@pytest.mark.parametrize("bad,match", [
    (np.array([[[1]]]), "1-D"), (np.array([1.5, 2.0]), "integer"), ([], "no prompts"), (np.array([True, False]), "integer"),
])
def test_bad_numpy_prompts_are_clear(llm, bad, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(bad, max_tokens=2, temperature=0.0)
