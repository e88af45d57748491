"""Prompt logprobs (vLLM's SamplingParams.prompt_logprobs) from the logits the graph returns for
every prompt row (logits_indices past one per sequence), against transformers' log-softmax of its
own forward pass (f32, the tiny DeepSeek-V3 export, OpenVINO and onnxruntime): every prompt
token's log-probability, rank and top-k, in prefill chunks of any size, beside other requests in
the batch, after a preemption, with the prefix cache holding the prompt already; the graph's
step check on logits_indices."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.runtime import LLMEngine, SamplingParams
from mla_export.runtime.llm import LLM

PROMPT = [5, 9, 17, 5, 9, 33, 41, 5, 9, 17, 60, 2, 71, 8, 8, 8, 19, 23, 5, 44, 90, 3]


@pytest.fixture(scope="module")
def setup(exports):
    ckpt, out = exports.model("deepseek_v3", "f32", 4, fmt="both")
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT])).logits[0].double().numpy()
    want = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    return out, want  # want[i]: log-probabilities of the token after position i


def _run(engine, requests):
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    final = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
    return final


def _check(prompt_logprobs, want, k):
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(PROMPT)
    for i in range(1, len(PROMPT)):
        entry, row, tok = prompt_logprobs[i], want[i - 1], PROMPT[i]
        assert entry[tok].logprob == pytest.approx(row[tok], abs=1e-5)
        assert entry[tok].rank == int((row > row[tok]).sum()) + 1
        top = np.argsort(-row, kind="stable")[:k].tolist()
        for rank, t in enumerate(top, 1):
            assert entry[t].logprob == pytest.approx(row[t], abs=1e-5)
            if t != tok:
                assert entry[t].rank == rank
        assert len(entry) in (k, k + 1)


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
@pytest.mark.parametrize("chunk", [512, 7])
def test_prompt_logprobs_equal_transformers(setup, runtime, chunk):
    out, want = setup
    engine = LLMEngine(out, runtime=runtime, precision="f32", num_blocks=64, max_num_batched_tokens=chunk,
                       block_order_seed=3)
    res = _run(engine, [
        ("plain", [7, 7, 3, 1, 2, 9, 11], SamplingParams(max_tokens=5, temperature=0.0)),
        ("lp", PROMPT, SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=3, logprobs=2)),
        ("decoding", [1, 2, 3], SamplingParams(max_tokens=9, temperature=0.0)),
    ])
    _check(res["lp"].prompt_logprobs, want, 3)
    assert res["plain"].prompt_logprobs is None
    # The first sampled token's logprob is the prompt's last row: the same as transformers' too.
    first = res["lp"].token_ids[0]
    assert res["lp"].logprobs[0][first].logprob == pytest.approx(want[-1][first], abs=1e-5)
    # The other requests' answers do not change with a prompt-logprobs request in their batch.
    alone = _run(LLMEngine(out, runtime=runtime, precision="f32", num_blocks=64, max_num_batched_tokens=chunk),
                 [("plain", [7, 7, 3, 1, 2, 9, 11], SamplingParams(max_tokens=5, temperature=0.0))])
    assert alone["plain"].token_ids == res["plain"].token_ids


def test_prompt_logprobs_skip_the_prefix_cache_and_survive_preemption(setup):
    out, want = setup
    engine = LLMEngine(out, precision="f32", num_blocks=64, block_order_seed=1)
    _run(engine, [("warm", PROMPT, SamplingParams(max_tokens=2, temperature=0.0))])  # the prompt is cached now
    hits = engine.stats()["prefix_cache_hits"]
    res = _run(engine, [("lp", PROMPT, SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=0))])
    _check(res["lp"].prompt_logprobs, want, 0)
    assert engine.stats()["prefix_cache_hits"] == hits  # every prompt row ran through the graph

    # A cache so small that the requests preempt one another mid-prompt and recompute.
    small = LLMEngine(out, precision="f32", num_blocks=10, max_num_batched_tokens=5, block_order_seed=2)
    reqs = [(f"r{i}", PROMPT, SamplingParams(max_tokens=12, temperature=0.0, prompt_logprobs=1)) for i in range(3)]
    res = _run(small, reqs)
    assert small.stats()["num_preemptions"] > 0
    for i in range(3):
        _check(res[f"r{i}"].prompt_logprobs, want, 1)


def test_delta_outputs_carry_prompt_logprobs_once(setup):
    out, want = setup
    engine = LLMEngine(out, precision="f32", num_blocks=64, max_num_batched_tokens=8)
    engine.add_request("d", PROMPT, SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=2,
                                                   output_kind="delta"))
    seen = []
    while engine.has_unfinished_requests():
        seen += [o.prompt_logprobs for o in engine.step()]
    assert seen[0] is not None and all(s is None for s in seen[1:])
    _check(seen[0], want, 2)


def test_llm_generate_returns_prompt_logprobs(setup):
    out, want = setup
    llm = LLM(model=out, dtype="float32")
    res = llm.generate([PROMPT], SamplingParams(max_tokens=3, temperature=0.8, seed=0, n=2, prompt_logprobs=4))
    _check(res[0].prompt_logprobs, want, 4)
    assert len(res[0].outputs) == 2


@pytest.mark.parametrize("bad", [-1, 21, 1.5, True])
def test_prompt_logprobs_values_are_checked(bad):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
def test_graph_checks_logits_indices(setup, runtime):
    """The graph's step check: rows strictly increasing, inside [0, T), at least one per sequence."""
    out, _ = setup
    engine = LLMEngine(out, runtime=runtime, precision="f32", num_blocks=16)
    be = engine.backend
    args = dict(seq_lens=[4, 3], query_lens=[4, 3], block_tables=[[0], [1]],
                new_token_ids=[[1, 2, 3, 4], [5, 6, 7]])
    good = be.build(**args, num_logits=[4, 2])
    assert good.logits_indices.tolist() == [0, 1, 2, 3, 5, 6]
    logits = np.array(be.executor.execute(good))
    assert logits.shape == (6, engine.facts.vocab_size)
    one = np.array(be.executor.execute(be.build(**args)))  # the default: each sequence's last row
    np.testing.assert_allclose(one, logits[[3, 5]], rtol=0, atol=1e-5)
    for bad, why in (([0, 1, 2, 3], "picks no row of sequence 1"), ([3, 2, 6], "strictly increasing"),
                     ([3, 7], "outside"), ([3], "at least one row per sequence")):
        md = be.build(**args)
        md = type(md)(**{**md.__dict__, "logits_indices": np.array(bad, np.int32)})
        with pytest.raises(Exception, match=why):
            be.executor.execute(md)
    for bad in ([5, 1], [0, 2], [1]):
        with pytest.raises(ValueError, match="num_logits"):
            be.build(**args, num_logits=bad)
