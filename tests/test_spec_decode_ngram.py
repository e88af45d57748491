"""Speculative decoding with n-gram drafts (issue 35, the ngram half; runtime/spec_decode.py).

One class per cause: the config as vLLM spells it, the proposer against a brute-force search,
the rejection sampler against the exact distribution, greedy outputs identical with speculation
on and off (OpenVINO and onnxruntime at f32, batch sizes 1/4/16, prefix-cache hits, preemption,
every stop condition, logprobs and a grammar request that does not speculate), the cache
bookkeeping after rejected drafts, LLM(speculative_config=...), and the server flag and metrics.
Prompts plant repetition (a random span repeated) so drafts get accepted with random weights.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mla_export.runtime.engine import LLMEngine
from mla_export.runtime.sampling import Sampler, SamplingParams
from mla_export.runtime.spec_decode import (SpeculativeConfig, TokenBuffer, propose_ngram, rejection_sample,
                                            verify_token)

RUNTIMES = ("openvino", "onnxruntime")
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """`mla-export export --preset tiny --format both` (OpenVINO IR and ONNX of one checkpoint)."""
    out = tmp_path_factory.mktemp("spec") / "tiny"
    proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "export", "--preset", "tiny", "--format", "both",
                           "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def planted_prompts(rng, count: int, vocab: int = 384) -> list[list[int]]:
    """Half repeat a random span (drafts get accepted), half are plain random token runs."""
    prompts = []
    for i in range(count):
        if i % 2 == 0:
            span = rng.integers(0, vocab, size=int(rng.integers(3, 10))).tolist()
            prompts.append(span * int(rng.integers(2, 5)))
        else:
            prompts.append(rng.integers(0, vocab, size=int(rng.integers(2, 30))).tolist())
    return prompts


def run(out_dir, prompts, params, spec=None, check=None, **kw):
    """{request id: (token ids, finish reason, logprobs)}, the engine's stats, the engine."""
    engine = LLMEngine(out_dir, precision="f32", speculative_config=spec, **kw)
    plist = params if isinstance(params, list) else [params] * len(prompts)
    assert len(plist) == len(prompts)
    for i, (p, sp) in enumerate(zip(prompts, plist)):
        engine.add_request(str(i), p, sp)
    outs, steps = {}, {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            assert o.error is None, o.error
            steps.setdefault(o.request_id, []).append(list(o.new_token_ids))
            if o.finished:
                outs[o.request_id] = (o.token_ids, o.finish_reason, o.logprobs, o.metrics, steps[o.request_id])
        if check is not None:
            check(engine)
    return outs, engine.stats(), engine


def tokens(outs):
    return {k: (v[0], v[1]) for k, v in outs.items()}


GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


class TestSpeculativeConfig:
    def test_vllm_spelling_and_defaults(self):
        cfg = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
        assert (cfg.num_speculative_tokens, cfg.prompt_lookup_max, cfg.prompt_lookup_min) == (3, 4, 4)
        cfg = SpeculativeConfig.parse({"method": "[ngram]", "num_speculative_tokens": 2})
        assert (cfg.method, cfg.prompt_lookup_max, cfg.prompt_lookup_min) == ("ngram", 5, 5)
        assert SpeculativeConfig.parse(None) is None

    @pytest.mark.parametrize("value, words", [
        ({"method": "glm4_moe_mtp", "num_speculative_tokens": 1}, ["'glm4_moe_mtp'", "not built"]),
        ({"method": "eagle", "num_speculative_tokens": 1}, ["'eagle'", "not supported"]),
        ({"method": "ngram"}, ["num_speculative_tokens"]),
        ({"method": "ngram", "num_speculative_tokens": 0}, ["num_speculative_tokens", ">= 1"]),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
         ["prompt_lookup_min (3)"]),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, ["'model'", "not supported"]),
        ("{not json", ["not JSON"]),
        ([1], ["must be a dict"]),
    ])
    def test_refused_naming_the_input(self, value, words):
        with pytest.raises(ValueError) as e:
            SpeculativeConfig.parse(value)
        for w in words:
            assert w in str(e.value)

    def test_engine_refuses_before_loading(self, tmp_path):
        with pytest.raises(ValueError, match="'glm4_moe_mtp' is not built"):
            LLMEngine(tmp_path / "nothing-here", speculative_config={"method": "glm4_moe_mtp",
                                                                     "num_speculative_tokens": 1})


def brute_force(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    for n in range(n_max, n_min - 1, -1):
        if len(tokens) < n + 1:
            continue
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # most recent earlier occurrence first
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


class TestNgramProposer:
    def test_examples(self):
        t = np.array([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3])
        assert propose_ngram(t, 3, 3, 1) == [7, 5, 1]  # the most recent earlier "1 2 3"
        assert propose_ngram(np.array([4, 5, 6, 4]), 3, 3, 1) == [5, 6, 4]  # n=1 after n=3, n=2 failed
        assert propose_ngram(np.array([4, 5, 6, 4]), 3, 3, 2) == []
        assert propose_ngram(np.array([8, 8]), 5, 2, 1) == [8]  # cut at the sequence's end
        assert propose_ngram(np.array([3]), 2, 2, 1) == []

    def test_token_buffer_follows_a_growing_list(self, rng):
        buf, tokens = TokenBuffer(), []
        for _ in range(50):
            tokens += rng.integers(0, 9, size=int(rng.integers(0, 7))).tolist()
            assert buf.sync(tokens).tolist() == tokens

    def test_against_brute_force(self, rng):
        for _ in range(400):
            seq = rng.integers(0, 4, size=int(rng.integers(1, 40))).tolist()
            n_min = int(rng.integers(1, 4))
            n_max = n_min + int(rng.integers(0, 3))
            k = int(rng.integers(1, 6))
            assert propose_ngram(np.array(seq, dtype=np.int64), k, n_max, n_min) == brute_force(seq, k, n_max, n_min), \
                (seq, k, n_max, n_min)


class TestRejectionSampler:
    """Accept d with p(d), else draw from p without d: every emitted token follows p exactly."""

    @pytest.mark.parametrize("draft", [0, 2, 4])
    def test_distribution_is_the_target(self, draft):
        p = np.array([0.05, 0.4, 0.3, 0.25, 0.0])
        gen = np.random.default_rng(1234)
        draws = 40000
        counts = np.zeros(p.size)
        accepted = 0
        for _ in range(draws):
            t, ok = rejection_sample(p, draft, gen)
            counts[t] += 1
            accepted += ok
        freq = counts / draws
        sigma = np.sqrt(p * (1 - p) / draws)
        assert np.all(np.abs(freq - p) <= 5 * sigma + 1e-12), (freq, p)
        assert abs(accepted / draws - p[draft]) <= 5 * np.sqrt(max(p[draft] * (1 - p[draft]), 1e-12) / draws) + 1e-12

    def test_verify_token_uses_processed_top_k_distribution(self):
        """Temperature, top-k and a penalty applied before the check: the draws follow the
        distribution plain sampling would draw from, for a draft inside and outside top-k."""
        sampler = Sampler()
        row = np.log(np.array([0.1, 0.2, 0.3, 0.15, 0.25], dtype=np.float32))
        params = SamplingParams(temperature=0.7, top_k=3, presence_penalty=0.5)
        history = ([1], [4])  # the output so far holds token 4: the presence penalty lowers it
        target = sampler.probabilities(sampler.process(row, params, *history), params)
        for draft in (2, 0):
            gen = np.random.default_rng(7)
            draws = 30000
            counts = np.zeros(row.size)
            for _ in range(draws):
                t, _ok = verify_token(sampler, row, params, gen, history, (), draft)
                counts[t] += 1
            sigma = np.sqrt(target * (1 - target) / draws)
            assert np.all(np.abs(counts / draws - target) <= 5 * sigma + 1e-12), (draft, counts / draws, target)


@pytest.mark.parametrize("runtime", RUNTIMES)
class TestGreedyIdentical:
    @pytest.mark.parametrize("batch", [1, 4, 16])
    def test_outputs_and_acceptance(self, tiny, rng, runtime, batch):
        prompts = planted_prompts(rng, 16 if batch > 1 else 6)
        kw = dict(runtime=runtime, max_num_seqs=batch)
        plain, _, _ = run(tiny, prompts, GREEDY, **kw)
        spec, stats, _ = run(tiny, prompts, GREEDY, NGRAM, **kw)
        assert tokens(spec) == tokens(plain)
        assert stats["spec_decode_num_accepted_tokens"] > 0
        assert stats["spec_decode_num_draft_tokens"] >= stats["spec_decode_num_accepted_tokens"]
        assert sum(stats["spec_decode_num_accepted_tokens_per_pos"]) == stats["spec_decode_num_accepted_tokens"]
        assert sum(v[3].spec_num_accepted_tokens for v in spec.values()) == stats["spec_decode_num_accepted_tokens"]
        assert stats["kv_blocks_used"] == 0  # every block given back

    @pytest.mark.parametrize("budget, spec", [
        (5, NGRAM),  # a 5-token step budget: prompts are chunked, drafts cut or dropped by the budget
        (512, {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 3, "prompt_lookup_min": 2}),
    ])
    def test_chunked_prefill_and_other_settings(self, tiny, rng, runtime, budget, spec):
        prompts = planted_prompts(rng, 8)
        kw = dict(runtime=runtime, max_num_batched_tokens=budget)
        plain, _, _ = run(tiny, prompts, GREEDY, **kw)
        got, stats, _ = run(tiny, prompts, GREEDY, spec, **kw)
        assert tokens(got) == tokens(plain)
        assert stats["spec_decode_num_accepted_tokens"] > 0

    def test_prefix_cache_hits_and_preemption(self, tiny, rng, runtime):
        """A cache of 12 blocks of 16 rows for 8 requests of up to ~70 rows: requests are
        preempted and recomputed, and the repeated prompts hit the prefix cache."""
        base = planted_prompts(rng, 4)
        prompts = base + [p + p[:5] for p in base]  # shared prefixes (full blocks) with the first four
        params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
        plain, _, _ = run(tiny, prompts, params, runtime=runtime)
        spec, stats, _ = run(tiny, prompts, params, NGRAM, runtime=runtime, num_blocks=12, max_num_seqs=8)
        assert tokens(spec) == tokens(plain)
        assert stats["num_preemptions"] > 0
        assert stats["prefix_cache_hits"] > 0
        assert stats["spec_decode_num_accepted_tokens"] > 0
        assert stats["kv_blocks_used"] == 0


class TestBf16BatchInvariant:
    """At bf16, a verify chunk's sums may differ from a one-token step's in the last bits, as the
    batch and prompt chunking already make them differ without speculation; batch-invariant
    mode (an int8 export, whose parts are row-invariant) makes greedy speculation exact there."""

    def test_greedy_identical(self, tmp_path_factory, rng):
        out = tmp_path_factory.mktemp("spec8") / "tiny8"
        proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "export", "--preset", "tiny", "--weight-format",
                               "int8", "-o", str(out), "-q"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        prompts = planted_prompts(rng, 16)
        kw = dict(precision="bf16", batch_invariant=True)
        engine = LLMEngine(out, **kw)
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, GREEDY)
        plain = {}
        while engine.has_unfinished_requests():
            plain.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
        engine = LLMEngine(out, speculative_config=NGRAM, **kw)
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, GREEDY)
        spec = {}
        while engine.has_unfinished_requests():
            spec.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
        assert spec == plain
        assert engine.stats()["spec_decode_num_accepted_tokens"] > 0


class TestStopConditionsAndLogprobs:
    """Accepted drafts pass through every per-token check in order: max_tokens, EOS / stop
    token ids, stop strings, min_tokens, penalties, bad_words and logprobs come out as plain."""

    def test_each_condition(self, tiny, rng):
        prompts = planted_prompts(rng, 13)
        plain_out, _, _ = run(tiny, prompts, GREEDY)
        # Stop tokens taken from the plain outputs, so some stop lands on an accepted draft.
        stop_ids = tuple({v[0][5] for v in plain_out.values()})
        params = [
            SamplingParams(max_tokens=7, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=30, temperature=0, stop_token_ids=stop_ids),
            SamplingParams(max_tokens=30, temperature=0, stop_token_ids=stop_ids, min_tokens=9),
            SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, logprobs=2),
            SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, repetition_penalty=1.3),
            SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, frequency_penalty=0.4),
            SamplingParams(max_tokens=30, temperature=0, stop=["e"], include_stop_str_in_output=True),
            SamplingParams(max_tokens=30, temperature=0, bad_words=["the"]),
            SamplingParams(max_tokens=30, temperature=0, output_kind="delta"),
            SamplingParams(max_tokens=30, temperature=0, logit_bias={5: 3.0}),
            SamplingParams(max_tokens=30, temperature=0, allowed_token_ids=tuple(range(0, 384, 3))),
            SamplingParams(max_tokens=1, temperature=0),
            SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, prompt_logprobs=1),
        ]
        plain, _, _ = run(tiny, prompts, params)
        spec, stats, _ = run(tiny, prompts, params, NGRAM)
        assert stats["spec_decode_num_accepted_tokens"] > 0
        for k in plain:
            if params[int(k)].output_kind == "delta":
                continue  # finished output holds the last step's tokens only: compared below
            assert spec[k][:2] == plain[k][:2], (params[int(k)], spec[k][:2], plain[k][:2])
        assert len(spec["0"][0]) == 7 and spec["0"][1] == "length"
        lp_plain, lp_spec = plain["3"][2], spec["3"][2]
        assert [list(e) for e in lp_spec] == [list(e) for e in lp_plain]
        for a, b in zip(lp_spec, lp_plain):
            for t in a:
                assert abs(a[t].logprob - b[t].logprob) < 1e-4 and a[t].rank == b[t].rank

    def test_stop_string_on_an_accepted_draft(self, tiny, rng):
        """Each request's stop string is the shortest text ending with a token the speculating
        run emitted as an accepted draft (not the last token of its step) that occurs nowhere
        before it: the stop lands inside a verify step, and the tokens after it must be dropped,
        as plain decoding never produces them."""
        prompts = planted_prompts(rng, 16)
        first, _, engine = run(tiny, prompts, GREEDY, NGRAM)
        decode = lambda ids: engine.tokenizer.decode(ids)  # noqa: E731
        stops = {}
        for rid, (toks, _r, _lp, _m, steps) in first.items():
            pos = 0
            for step in steps:
                for j in range(pos, pos + len(step) - 1):  # accepted drafts: all but a step's last token
                    text, before = decode(toks[:j + 1]), decode(toks[:j])
                    if rid in stops or not text.startswith(before) or len(text) == len(before):
                        continue
                    for cut in range(len(text) - 1, -1, -1):
                        if text[cut:] not in text[:-1]:
                            stops[rid] = text[cut:]
                            break
                pos += len(step)
        assert len(stops) >= 2, "too few planted prompts got a draft accepted"
        ids = sorted(stops, key=int)
        chosen = [prompts[int(r)] for r in ids]
        params = [SamplingParams(max_tokens=GREEDY.max_tokens, temperature=0, stop=[stops[r]],
                                 include_stop_str_in_output=True, ignore_eos=True) for r in ids]
        plain, _, _ = run(tiny, chosen, params)
        spec, _, _ = run(tiny, chosen, params, NGRAM)
        assert tokens(spec) == tokens(plain)
        ended_mid_step = [k for k, v in spec.items() if v[1] == "stop" and len(v[4][-1]) > 1]
        assert ended_mid_step, "no stop string landed inside a verify step"

    def test_delta_outputs_join_to_the_plain_output(self, tiny, rng):
        prompts = planted_prompts(rng, 4)
        p = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, output_kind="delta")
        got = {}
        for spec in (None, NGRAM):
            engine = LLMEngine(tiny, precision="f32", speculative_config=spec)
            for i, pr in enumerate(prompts):
                engine.add_request(str(i), pr, p)
            joined = {str(i): [] for i in range(len(prompts))}
            texts = {str(i): "" for i in range(len(prompts))}
            while engine.has_unfinished_requests():
                for o in engine.step():
                    joined[o.request_id] += o.new_token_ids
                    texts[o.request_id] += o.new_text or ""
            got[spec is None] = (joined, texts)
        assert got[False] == got[True]

    def test_grammar_request_runs_plain_in_the_same_batch(self, tiny, rng):
        from mla_export.runtime.sampling import StructuredOutputsParams

        prompts = planted_prompts(rng, 4)
        params = [GREEDY, SamplingParams(max_tokens=8, temperature=0,
                                         structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))] * 2
        plain, _, _ = run(tiny, prompts, params)
        spec, _, _ = run(tiny, prompts, params, NGRAM)
        assert tokens(spec) == tokens(plain)
        for k in ("1", "3"):
            assert spec[k][3].spec_num_draft_tokens == 0  # never speculated
        assert spec["0"][3].spec_num_draft_tokens > 0


class TestCacheBookkeeping:
    """After every step: a running request holds exactly the blocks of its committed rows
    (blocks of rejected drafts returned), and the prefix cache holds only committed tokens."""

    def test_blocks_follow_committed_tokens(self, tiny, rng):
        def check(engine):
            kv = engine.kv_cache
            for req in engine.scheduler.running:
                table = kv.block_table(req.request_id)
                assert len(table) == -(-req.num_computed_tokens // kv.block_size), req.request_id
                assert req.num_computed_tokens <= req.num_tokens
                if req.output_token_ids:  # decoding (no preemption here): every token's row but the newest
                    assert req.num_computed_tokens == req.num_tokens - 1, req.request_id
                # Every registered block of the table holds the request's committed tokens.
                hashes = kv._full_block_hashes(req.request_id, req.all_token_ids)
                for i, block in enumerate(table):
                    h = kv.pool._hash_of[block]
                    if h is not None:
                        assert i < len(hashes) and h == hashes[i]
                        assert (i + 1) * kv.block_size <= req.num_computed_tokens

        prompts = planted_prompts(rng, 8)
        _, stats, _ = run(tiny, prompts, SamplingParams(max_tokens=60, temperature=0, ignore_eos=True), NGRAM,
                          check=check)
        assert stats["spec_decode_num_draft_tokens"] > stats["spec_decode_num_accepted_tokens"] > 0  # some rejected
        assert stats["num_preemptions"] == 0


def chi2_two_sample(a: dict, b: dict, n: int) -> tuple[float, float]:
    """(statistic, its 0.999 quantile) of the two-sample chi-square test of equal distributions
    over the cells of a and b (equal sample sizes n; cells with fewer than 10 in both pooled into
    one); the quantile by Wilson-Hilferty (no scipy here)."""
    cells = sorted(set(a) | set(b))
    big = [c for c in cells if a.get(c, 0) + b.get(c, 0) >= 10]
    rows = [(a.get(c, 0), b.get(c, 0)) for c in big]
    small = [(a.get(c, 0), b.get(c, 0)) for c in cells if c not in big]
    if small:
        rows.append((sum(x for x, _ in small), sum(y for _, y in small)))
    stat = sum((x - y) ** 2 / (x + y) for x, y in rows if x + y)
    df = len(rows) - 1
    z = 3.090  # the standard normal's 0.999 quantile
    return stat, df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


class TestSampling:
    def test_distribution_kept_through_the_engine(self, tiny):
        """A 3-token vocabulary (allowed_token_ids) and a prompt repeating it: 2000 seeded requests
        of 4 tokens with and without speculation (k=2, so drafts at positions 1-2 and 2-3, and
        bonus tokens); the joint distributions of the 4 tokens agree (two-sample chi-square at
        0.999; the seeds are fixed, so the result is too)."""
        import collections

        allowed = (10, 20, 30)
        prompt = [10, 20, 30] * 3 + [10, 20]
        n = 2000
        got = {}
        for spec in (None, {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3,
                            "prompt_lookup_min": 1}):
            params = [SamplingParams(max_tokens=4, temperature=1.5, seed=10_000 + i, allowed_token_ids=allowed,
                                     ignore_eos=True) for i in range(n)]
            outs, stats, _ = run(tiny, [prompt] * n, params, spec, max_num_seqs=64)
            got[spec is None] = collections.Counter(tuple(v[0]) for v in outs.values())
            if spec is not None:
                assert stats["spec_decode_num_draft_tokens"] > n
                assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
        stat, limit = chi2_two_sample(got[True], got[False], n)
        assert stat < limit, (stat, limit)

    def test_seeded_sampling_speculates_and_repeats(self, tiny, rng):
        """Sampling requests speculate too (rejection sampling): a seeded run repeats itself."""
        prompts = planted_prompts(rng, 6)
        params = [SamplingParams(max_tokens=30, temperature=0.3, top_k=5, seed=i, ignore_eos=True) for i in range(6)]
        a, stats, _ = run(tiny, prompts, params, NGRAM)
        b, _, _ = run(tiny, prompts, params, NGRAM)
        assert tokens(a) == tokens(b)
        assert stats["spec_decode_num_accepted_tokens"] > 0


class TestLLMAndServer:
    def test_llm_speculative_config(self, tiny, rng):
        from mla_export import LLM

        prompts = planted_prompts(rng, 4)
        outs = {}
        for spec in (None, NGRAM):
            kw = {} if spec is None else {"speculative_config": spec}
            llm = LLM(model=str(tiny), dtype="float32", **kw)
            outs[spec is None] = [o.outputs[0].token_ids for o in llm.generate(
                [{"prompt_token_ids": p} for p in prompts], GREEDY)]
            if spec is not None:
                assert llm.engine.stats()["spec_decode_num_accepted_tokens"] > 0
        assert outs[True] == outs[False]

    def test_serve_flag_and_metrics(self, tiny):
        import json

        import httpx
        from server_helpers import metrics, start_serve_subprocess

        proc, base = start_serve_subprocess(tiny, "--precision", "f32", "--speculative-config", json.dumps(NGRAM))
        try:
            span = list(range(40, 47))
            r = httpx.post(f"{base}/v1/completions", json={
                "model": tiny.name, "prompt": span * 4, "max_tokens": 24, "temperature": 0, "ignore_eos": True},
                timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 24
            m = metrics(base)
            name = f'{{model_name="{tiny.name}"}}'
            assert m["vllm:spec_decode_num_drafts_total" + name] > 0
            assert m["vllm:spec_decode_num_draft_tokens_total" + name] > 0
            assert m["vllm:spec_decode_num_accepted_tokens_total" + name] > 0
            assert m[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{tiny.name}",position="0"}}'] > 0
        finally:
            proc.terminate()
            proc.communicate(timeout=120)

    def test_generate_flag(self, tiny, capsys):
        import json

        from mla_export.cli import main

        base = ["generate", str(tiny), "--prompt-ids", ",".join(map(str, [5, 6, 7, 8] * 4)), "-n", "20",
                "--precision", "f32", "--ignore-eos", "--json"]
        assert main(base) == 0
        plain = json.loads(capsys.readouterr().out)
        assert main(base + ["--speculative-config", json.dumps(NGRAM)]) == 0
        spec = json.loads(capsys.readouterr().out)
        assert spec["token_ids"] == plain["token_ids"]
        assert spec["spec_decode_num_draft_tokens"] > 0 and "spec_decode_num_draft_tokens" not in plain
        assert main(base + ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 1}']) == 2
        err = capsys.readouterr().err
        assert "'eagle' is not supported" in err and "Traceback" not in err

    def test_metrics_only_when_speculating(self):
        from mla_export.server.metrics import ServerMetrics, parse_prometheus_text

        m = ServerMetrics(model_name="m")
        plain = parse_prometheus_text(m.render({"num_running": 0}, model="m", healthy=True))
        assert not [k for k in plain if "spec_decode" in k]
        got = parse_prometheus_text(m.render({"spec_decode_num_drafts": 4, "spec_decode_num_draft_tokens": 12,
                                              "spec_decode_num_accepted_tokens": 5,
                                              "spec_decode_num_accepted_tokens_per_pos": [3, 2, 0]},
                                             model="m", healthy=True))
        assert got['vllm:spec_decode_num_drafts_total{model_name="m"}'] == 4
        assert got['vllm:spec_decode_num_draft_tokens_total{model_name="m"}'] == 12
        assert got['vllm:spec_decode_num_accepted_tokens_total{model_name="m"}'] == 5
        assert got['vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"}'] == 2

    def test_serve_replicas_pass_the_config_on(self, tiny):
        import argparse

        from mla_export.cli.commands import serve
        from mla_export.cli.commands.serve_ray import settings_from_args

        parser = argparse.ArgumentParser()
        serve.add_parser(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["serve", str(tiny), "--replicas", "2", "--speculative-config", '{"method": "ngram", '
                                  '"num_speculative_tokens": 2}'])
        cfg = SpeculativeConfig.parse(settings_from_args(args, tiny).engine_kwargs["speculative_config"])
        assert (cfg.method, cfg.num_speculative_tokens) == ("ngram", 2)

    def test_serve_refuses_other_methods(self, tiny):
        proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "serve", str(tiny), "--port", "0",
                               "--speculative-config",
                               '{"method": "glm4_moe_mtp", "num_speculative_tokens": 1}'], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2
        assert "--speculative-config" in proc.stderr and "'glm4_moe_mtp' is not built" in proc.stderr
        assert "Traceback" not in proc.stderr
