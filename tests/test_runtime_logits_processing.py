"""vLLM's sampling options in the engine against transformers' own logits processors (f32, the
tiny DeepSeek-V3 export): repetition_penalty (RepetitionPenaltyLogitsProcessor), min_tokens
(min_new_tokens), logit_bias (sequence_bias of single tokens) and allowed_token_ids in greedy
generation, logprobs against the log-softmax of transformers' raw logits; presence and frequency
penalties and min_p against a direct numpy statement of vLLM's rules."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.runtime import LLMEngine, SamplingParams
from mla_export.runtime.sampling import Sampler

MAX = 12


@pytest.fixture(scope="module")
def setup(exports):
    ckpt, out = exports.model("deepseek_v3", "f32", 4)
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    engine = LLMEngine(out, precision="f32", num_blocks=64)
    return hf, engine


def _engine_run(engine, prompt, params):
    engine.add_request("r", prompt, params)
    final = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                final = o
    return final


def _hf_generate(hf, prompt, **kw):
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX, do_sample=False,
                          pad_token_id=hf.generation_config.eos_token_id, output_logits=True,
                          return_dict_in_generate=True, **kw)
    return out.sequences[0, len(prompt):].tolist(), [lg[0].float().numpy() for lg in out.logits]


PROMPT = [5, 9, 17, 5, 9, 33, 41, 5, 9, 17]


@pytest.mark.parametrize("ours, theirs", [
    (dict(repetition_penalty=1.8), dict(repetition_penalty=1.8)),
    (dict(repetition_penalty=0.6), dict(repetition_penalty=0.6)),
    (dict(min_tokens=MAX, ignore_eos=False), dict(min_new_tokens=MAX)),
    (dict(logit_bias={7: 4.0, 11: -100.0}), dict(sequence_bias={(7,): 4.0, (11,): -100.0})),
])
def test_greedy_with_logits_processors_equals_transformers(setup, ours, theirs):
    hf, engine = setup
    got = _engine_run(engine, PROMPT, SamplingParams(max_tokens=MAX, temperature=0.0, **ours))
    want, _ = _hf_generate(hf, PROMPT, **theirs)
    assert got.token_ids == want
    plain = _engine_run(engine, PROMPT, SamplingParams(max_tokens=MAX, temperature=0.0))
    if "min_tokens" not in ours:  # the option changes the answer (else the test could not fail)
        assert plain.token_ids != got.token_ids


def test_allowed_token_ids_only(setup):
    _, engine = setup
    allowed = [3, 8, 21, 60]
    out = _engine_run(engine, PROMPT, SamplingParams(max_tokens=MAX, temperature=0.0, allowed_token_ids=allowed))
    assert set(out.token_ids) <= set(allowed) and len(out.token_ids) == MAX
    sampled = _engine_run(engine, PROMPT, SamplingParams(max_tokens=MAX, temperature=1.0, seed=3,
                                                         allowed_token_ids=allowed))
    assert set(sampled.token_ids) <= set(allowed)


def test_logprobs_are_the_log_softmax_of_the_model_logits(setup):
    hf, engine = setup
    out = _engine_run(engine, PROMPT, SamplingParams(max_tokens=MAX, temperature=0.0, logprobs=5))
    want, logits = _hf_generate(hf, PROMPT)
    assert out.token_ids == want and len(out.logprobs) == len(want)
    total = 0.0
    for tok, entry, lg in zip(want, out.logprobs, logits):
        ref = lg.astype(np.float64) - np.logaddexp.reduce(lg.astype(np.float64))
        top = np.argsort(-ref, kind="stable")[:5]
        assert set(entry) == set(top.tolist()) | {tok}
        for t, lp in entry.items():
            assert lp.logprob == pytest.approx(ref[t], abs=2e-5)
            assert lp.rank == int((ref > ref[t]).sum()) + 1
            assert isinstance(lp.decoded_token, str)
        assert entry[tok].rank == 1  # greedy
        total += ref[tok]
    assert out.cumulative_logprob == pytest.approx(total, abs=1e-4)


def test_presence_frequency_and_min_p_follow_vllm(rng):
    vocab = 50
    row = rng.standard_normal(vocab).astype(np.float32)
    prompt, output = [1, 2, 3], [4, 4, 5, 4]
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.3)
    got = Sampler.process(row, p, prompt, output)
    want = row.astype(np.float64).copy()
    for t in set(prompt) | set(output):  # repetition: prompt and output
        want[t] = want[t] / 1.3 if want[t] > 0 else want[t] * 1.3
    for t in set(output):
        want[t] -= 0.25 * output.count(t) + 0.5
    np.testing.assert_allclose(got, want, rtol=1e-6)
    probs = Sampler.probabilities(row, SamplingParams(min_p=0.2))
    full = np.exp(row - row.max())
    kept = full >= 0.2 * full.max()
    assert np.all(probs[~kept] == 0) and np.all(probs[kept] > 0)
    np.testing.assert_allclose(probs[kept], full[kept] / full[kept].sum(), rtol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(presence_penalty=3), "presence_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_tokens=20, max_tokens=10), "min_tokens"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={3: 200}), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(logprobs=21), "logprobs"),
    (dict(bad_words=[""]), "bad_words"),
    (dict(bad_words=[3]), "bad_words"),
    (dict(bad_words_token_ids=[[]]), "bad_words_token_ids"),
])
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_words_follow_vllm(rng):
    """vLLM's NoBadWordsLogitsProcessor: a one-token word is always banned; a longer one's last
    token only where the output ends with its other tokens."""
    vocab = 40
    row = rng.standard_normal(vocab).astype(np.float32)
    p = SamplingParams(bad_words_token_ids=[[7], [3, 4, 9], [5, 11]])
    for output, banned in (([], {7}), ([3, 4], {7, 9}), ([4, 3], {7}), ([1, 5], {7, 11}), ([3, 4, 5], {7, 11})):
        got = Sampler.process(row, p, [1, 2], output)
        assert set(np.flatnonzero(np.isinf(got)).tolist()) == banned
        keep = [t for t in range(vocab) if t not in banned]
        np.testing.assert_array_equal(got[keep], row[keep])


def test_bad_words_in_generation(setup):
    """A tokenized word (with and without a leading space, vLLM's rule) never appears in the
    output; the greedy answer changes where it would have."""
    _, engine = setup
    if engine.tokenizer is None:
        pytest.skip("the export has no tokenizer")
    free = _engine_run(engine, PROMPT, SamplingParams(max_tokens=MAX, temperature=0.0, ignore_eos=True))
    word = engine.tokenizer.decode(free.token_ids[2:3]).strip() or engine.tokenizer.decode(free.token_ids[3:4]).strip()
    seqs = engine._bad_words_token_ids([word])
    got = _engine_run(engine, PROMPT, SamplingParams(max_tokens=MAX, temperature=0.0, ignore_eos=True,
                                                     bad_words=[word]))
    assert got.token_ids != free.token_ids
    for seq in seqs:
        n = len(seq)
        assert all(tuple(got.token_ids[i:i + n]) != seq for i in range(len(got.token_ids) - n + 1))
