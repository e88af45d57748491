"""End to end: the engine's greedy tokens equal transformers' greedy `generate`, token for token,
through shuffled blocks, chunked prefill, continuous batching, preemption and prefix caching."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.runtime import LLMEngine, SamplingParams
from runtime_models import hf_greedy

BLOCK_SIZE = 4
MAX_TOKENS = 10


def _prompts(lengths, vocab, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, size=n).tolist() for n in lengths]  # no bos/eos inside


def _run(engine, arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]]) -> dict:
    """Submit requests at the given step numbers; return every request's final output."""
    final, step = {}, 0
    while arrivals or engine.has_unfinished_requests():
        for rid, prompt, params in arrivals.pop(step, []):
            engine.add_request(rid, prompt, params)
        for out in engine.step():
            assert out.token_ids[-len(out.new_token_ids):] == out.new_token_ids
            if out.finished:
                final[out.request_id] = out
        step += 1
        assert step < 500
    return final


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2"])
def test_greedy_equals_transformers_with_chunking_and_preemption(exports, model_type):
    ckpt, out_dir = exports.model(model_type, "f32", BLOCK_SIZE)
    budget, num_blocks = 16, 16
    lengths, arrival_steps = [5, 13, 22, 37], [0, 0, 2, 5]
    assert max(lengths) > budget  # the long prompts must be prefilled in chunks
    engine = LLMEngine(out_dir, precision="f32", num_blocks=num_blocks, max_num_batched_tokens=budget,
                       block_order_seed=7)
    prompts = _prompts(lengths, engine.facts.vocab_size, seed=1)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    arrivals: dict = {}
    for i, (prompt, step) in enumerate(zip(prompts, arrival_steps)):
        arrivals.setdefault(step, []).append((f"r{i}", prompt, params))

    final = _run(engine, arrivals)

    for i, prompt in enumerate(prompts):
        expected = hf_greedy(ckpt, prompt, MAX_TOKENS)
        out = final[f"r{i}"]
        assert out.prompt_token_ids == prompt
        assert out.token_ids == expected, f"request r{i} (prompt of {len(prompt)} tokens)"
        assert out.finish_reason == ("length" if len(expected) == MAX_TOKENS else "stop")
    stats = engine.stats()
    assert stats["num_preemptions"] >= 1  # 16 blocks cannot hold the four requests at once
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == stats["num_waiting"] == 0
    assert all(engine.kv_cache.pool.ref_count(b) == 0 for b in range(num_blocks))


def test_prefix_caching_computes_only_new_tokens_and_keeps_the_tokens(exports):
    ckpt, out_dir = exports.model("deepseek_v3", "f32", BLOCK_SIZE)
    engine = LLMEngine(out_dir, precision="f32", num_blocks=64, max_num_batched_tokens=64, block_order_seed=3)
    (base,) = _prompts([30], engine.facts.vocab_size, seed=2)
    (tail,) = _prompts([5], engine.facts.vocab_size, seed=3)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    # b shares 24 tokens (6 full blocks) with a; c is a's first 28 tokens (7 full blocks) exactly,
    # so its last token is recomputed into a private copy of a shared block. They arrive while a
    # is decoding, so the blocks are shared live.
    prompts = {"a": base, "b": base[:24] + tail, "c": base[:28]}
    final = _run(engine, {0: [("a", base, params)], 2: [("b", prompts["b"], params), ("c", prompts["c"], params)]})

    m = {rid: final[rid].metrics for rid in prompts}
    assert (m["a"].num_cached_prompt_tokens, m["a"].num_computed_prompt_tokens) == (0, 30)
    assert (m["b"].num_cached_prompt_tokens, m["b"].num_computed_prompt_tokens) == (24, 5)
    assert (m["c"].num_cached_prompt_tokens, m["c"].num_computed_prompt_tokens) == (27, 1)
    stats = engine.stats()
    assert stats["copy_on_write_blocks"] == 1
    assert (stats["prefix_cache_queries"], stats["prefix_cache_hits"]) == (30 + 29 + 28, 24 + 27)
    for rid, prompt in prompts.items():
        assert final[rid].token_ids == hf_greedy(ckpt, prompt, 6), rid
    assert stats["kv_blocks_used"] == 0


def test_abort_frees_blocks_and_seeded_sampling_repeats(exports):
    _, out_dir = exports.model("deepseek_v3", "f32", BLOCK_SIZE)
    engine = LLMEngine(out_dir, precision="f32", num_blocks=32, block_order_seed=5)
    (prompt,) = _prompts([9], engine.facts.vocab_size, seed=4)
    sampled = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    engine.add_request("keep", prompt, sampled)
    engine.add_request("drop", prompt, SamplingParams(max_tokens=50))
    engine.step()
    engine.step()
    assert engine.stats()["kv_blocks_used"] > 0
    engine.abort_request("drop")
    final = _run(engine, {})
    assert set(final) == {"keep"} and len(final["keep"].token_ids) == 8
    assert engine.stats()["kv_blocks_used"] == 0
    # The same seed alone in the batch draws the same tokens.
    again = _run(engine, {0: [("again", prompt, sampled)]})
    assert again["again"].token_ids == final["keep"].token_ids


@pytest.mark.parametrize("kv_dtype", ["f16", "int8", "fp8", "e5m2"])
def test_cache_formats_through_chunking_preemption_and_prefix_caching(exports, kv_dtype):
    """The engine on f16 / int8 / fp8 / e5m2 caches (u8 byte arrays bound in place, copied block by block
    on copy-on-write): f16 gives transformers' greedy tokens like f32 does; the quantised ones round
    more, so their oracle is the same export run one request at a time, unchunked, without
    prefix caching or preemption (fixed prompts: the comparison is deterministic)."""
    ckpt, out_dir = exports.model("deepseek_v3", kv_dtype, BLOCK_SIZE)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    engine = LLMEngine(out_dir, precision="f32", num_blocks=16, max_num_batched_tokens=16, block_order_seed=3)
    assert engine.backend.kv_caches[0].dtype == (np.float16 if kv_dtype == "f16" else np.uint8)
    prompts = _prompts([5, 13, 22, 37], engine.facts.vocab_size, seed=1)
    prompts.append(prompts[2][:20] + [5, 6])  # shares 5 full blocks with r2: a prefix-cache hit
    arrivals: dict = {}
    for i, (prompt, step) in enumerate(zip(prompts, [0, 0, 2, 5, 9])):
        arrivals.setdefault(step, []).append((f"r{i}", prompt, params))
    final = _run(engine, arrivals)
    assert engine.stats()["num_preemptions"] >= 1
    assert engine.stats()["prefix_cache_hits"] >= 1
    alone = None if kv_dtype == "f16" else LLMEngine(out_dir, precision="f32", num_blocks=32,
                                                     max_num_batched_tokens=512, enable_prefix_caching=False)
    for i, prompt in enumerate(prompts):
        if alone is None:
            expected = hf_greedy(ckpt, prompt, MAX_TOKENS)
        else:
            expected = _run(alone, {0: [(f"x{i}", prompt, params)]})[f"x{i}"].token_ids
        assert final[f"r{i}"].token_ids == expected, f"request r{i} (prompt of {len(prompt)} tokens)"
