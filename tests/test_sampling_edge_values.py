"""Sampling values at their edges (issue 36, cause 2), offline and over HTTP: a temperature under
vLLM's epsilon (1e-5) is greedy (a denormal one overflowed `logits / temperature` and made every
token the last vocabulary id); every value is checked where it enters (SamplingParams, the
server's request parsing) and a refusal names its field; a repetition penalty near 0 cannot
make the sampler's row NaN. Tiny preset, f32."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest

from server_helpers import ServerThread

TINY_EDGE_TEMPERATURES = (1e-310, 5e-324, 1e-30, 9.9e-6)


@pytest.fixture(scope="module")
def llm(exports):
    from mla_export import LLM

    return LLM(exports.tiny(), dtype="float32", max_num_seqs=4)


@pytest.fixture(scope="module")
def server(llm):
    with ServerThread(llm.engine, model_name="tiny", max_num_seqs=4, max_queue=16) as srv:
        yield srv


def _complete(server, **body) -> httpx.Response:
    return httpx.post(server.base + "/v1/completions", json={"prompt": "Hello there", **body}, timeout=120)


class TestTemperatureUnderEpsilonIsGreedy:
    def test_offline(self, llm):
        from mla_export import SamplingParams

        greedy = llm.generate(["Hello there"], SamplingParams(temperature=0.0, max_tokens=8))[0].outputs[0].token_ids
        vocab = llm.engine.facts.vocab_size
        assert set(greedy) != {vocab - 1}
        for t in TINY_EDGE_TEMPERATURES:
            for seed in (0, 1):
                p = SamplingParams(temperature=t, max_tokens=8, seed=seed)
                assert p.greedy
                got = llm.generate(["Hello there"], p)[0].outputs[0].token_ids
                assert got == greedy, (t, seed)

    def test_at_the_epsilon_it_samples(self):
        from mla_export.runtime.sampling import SAMPLING_EPS, SamplingParams

        assert not SamplingParams(temperature=SAMPLING_EPS).greedy
        assert SamplingParams(temperature=0.0).greedy

    def test_over_http(self, server):
        want = _complete(server, max_tokens=8, temperature=0, return_token_ids=True)
        assert want.status_code == 200, want.text
        for t in TINY_EDGE_TEMPERATURES:
            r = _complete(server, max_tokens=8, temperature=t, seed=3, return_token_ids=True)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"] == want.json()["choices"][0]["token_ids"], t


class TestSamplingValuesAsTheyArrive:
    """Each refusal names its field (SamplingParamError.param; the server's 400 `param`)."""

    @pytest.mark.parametrize("field,value", [
        ("temperature", math.nan), ("temperature", math.inf), ("temperature", -1e-310),
        ("top_p", math.nan), ("top_p", 0.0), ("top_p", 1 + 1e-12), ("top_k", -2), ("top_k", 1.5),
        ("min_p", math.nan), ("min_p", 1.0000001), ("presence_penalty", math.inf), ("frequency_penalty", -math.inf),
        ("repetition_penalty", 0.0), ("repetition_penalty", math.nan), ("seed", -2), ("seed", 1.0),
        ("n", 0), ("n", 10**9), ("max_tokens", 0), ("max_tokens", 2.0),
        ("logit_bias", {"\u0663": 1.0}), ("logit_bias", {"9" * 5000: 1.0}), ("logit_bias", {"-1": 1.0}),
        ("logit_bias", {3: math.nan}), ("logit_bias", {3: 1e300}),
    ])
    def test_offline_refusals_name_the_field(self, field, value):
        from mla_export.runtime.sampling import SamplingParamError, SamplingParams

        with pytest.raises(SamplingParamError) as e:
            SamplingParams(**{field: value})
        assert e.value.param == field, str(e.value)
        assert len(str(e.value)) < 300

    def test_accepted_edges(self):
        from mla_export.runtime.sampling import MAX_N, SamplingParams

        assert SamplingParams(seed=-1).seed is None  # vLLM's "no seed"
        assert SamplingParams(seed=2**70).make_generator() is not None
        assert SamplingParams(n=MAX_N).n == MAX_N
        assert SamplingParams(logit_bias={"007": 1e-310}).logit_bias == {7: 1e-310}
        assert SamplingParams(top_k=10**30, top_p=1e-310, min_p=1e-310, presence_penalty=5e-324).top_k == 10**30

    def test_a_tiny_repetition_penalty_cannot_make_the_row_nan(self):
        from mla_export.runtime.sampling import Sampler, SamplingParams

        row = np.array([3.0, -2.0, 5.0, 0.5], np.float32)
        for penalty in (1e-300, 5e-324, 1e-40):
            p = SamplingParams(repetition_penalty=penalty, temperature=0.7, seed=0)
            x = Sampler.process(row, p, prompt=[0, 2], output=[1])
            assert not np.isnan(x).any() and not np.isposinf(x).any(), (penalty, x)
            probs = Sampler.probabilities(x, p)
            assert np.isfinite(probs).all() and abs(probs.sum() - 1) < 1e-9
            tok = Sampler().sample(row[None], [p], [p.make_generator()], histories=[([0, 2], [1])])
            assert int(tok[0]) in (0, 2)  # a penalised positive logit divided by ~0 is the favourite

    @pytest.mark.parametrize("body,param", [
        ({"logit_bias": {"9" * 5000: 1}}, "logit_bias"),  # a 500 before: int() of the key raised
        ({"logit_bias": {"\u0663": 1}}, "logit_bias"),  # an Arabic-Indic 3 was token 3
        ({"logit_bias": {"999999": 1}}, "logit_bias"),  # outside the vocabulary: named now
        ({"allowed_token_ids": [999999]}, "allowed_token_ids"),
        ({"temperature": -1e-310}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 10**6}, "n"),
    ])
    def test_over_http_refusals_name_the_field(self, server, body, param):
        r = _complete(server, max_tokens=2, **body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.text

    def test_json_nan_and_infinity_literals_are_400(self, server):
        for field, lit in (("temperature", "NaN"), ("top_p", "Infinity"), ("presence_penalty", "-Infinity")):
            raw = f'{{"prompt": "hi", "max_tokens": 2, "{field}": {lit}}}'.encode()
            r = httpx.post(server.base + "/v1/completions", content=raw, headers={"content-type": "application/json"},
                           timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text

    def test_denormal_values_that_compute_safely_are_served(self, server):
        for body in ({"top_p": 1e-310}, {"min_p": 1e-310}, {"presence_penalty": 5e-324},
                     {"logit_bias": {"5": 1e-310}}, {"seed": 2**64 - 1}, {"top_k": 10**30}):
            r = _complete(server, max_tokens=3, temperature=0.8, **body)
            assert r.status_code == 200, (body, r.text)
            assert json.dumps(r.json())  # a well-formed answer


class TestNoTokenLeft:
    """Masks that leave no token: greedy took token 0 and sampling drew from a NaN row. Refused at
    admission when the request's own fields empty the allowed set, else the request ends with an
    error the moment it happens."""

    def test_refused_at_admission_naming_the_field(self, llm, server):
        from mla_export import SamplingParams
        from mla_export.runtime.sampling import SamplingParamError

        eos = min(llm.engine.facts.eos_token_ids)
        word = llm.tokenizer.decode([300])
        assert llm.tokenizer.encode(word, add_special_tokens=False).ids == [300]
        for kw in (dict(allowed_token_ids=[eos], min_tokens=2), dict(allowed_token_ids=[eos, 7], stop_token_ids=[7],
                                                                     min_tokens=1),
                   dict(allowed_token_ids=[300], bad_words=[word])):
            for t in (0.0, 0.8):
                with pytest.raises(SamplingParamError) as e:
                    llm.generate("Hello there", SamplingParams(max_tokens=4, temperature=t, **kw))
                assert e.value.param == "allowed_token_ids"
            r = _complete(server, max_tokens=4, **kw)
            assert r.status_code == 400 and r.json()["error"]["param"] == "allowed_token_ids", r.text
        assert not llm.engine.has_unfinished_requests()

    def test_a_row_masked_later_ends_the_request(self, llm):
        from mla_export import SamplingParams

        tok = llm.tokenizer
        # a: its doubled text is two a's (bad word "aa": a banned after an a); b: a one-token bad word
        letters = [i for i in range(llm.engine.facts.vocab_size) if tok.decode([i]).isalpha()]
        a = next(i for i in letters if tok.encode(tok.decode([i]) * 2, add_special_tokens=False).ids == [i, i])
        b = next(i for i in letters if i != a and tok.encode(tok.decode([i]), add_special_tokens=False).ids == [i])
        for t in (0.0, 0.8):
            params = SamplingParams(max_tokens=4, temperature=t, seed=0, allowed_token_ids=[a, b],
                                    bad_words=[tok.decode([b]), tok.decode([a]) * 2])
            with pytest.raises(RuntimeError, match="no token can be generated"):
                llm.generate("Hello there", params)
        assert not llm.engine.has_unfinished_requests()
