"""DeepSeek Sparse Attention models (deepseek_v32, glm_moe_dsa) against transformers' own
implementation (f32), with sequences many times longer than their top-k (16 of up to 300
positions), in OpenVINO (the IR) and onnxruntime (model.onnx with the mla-export ops).

The tiny checkpoints are made by transformers' own classes (`make_checkpoint`: 16 indexer heads of
32 values, so that ties in the indexer's scores, whose order torch does not define, do not occur;
GLM-5's layer 1 shares layer 0's selection). First the paged schedule through the runtime's
backend (prefill chunks, shuffled blocks, three sequences, every row's logits within 1e-5 of
transformers' and every greedy token equal), then the engine end to end: greedy tokens equal to
transformers' `generate` through chunked prefill, preemption and prefix-cache hits (the
indexer-key caches ride on the same blocks), and an int8 cache against the same export run alone."""

from __future__ import annotations

import numpy as np
import pytest

from hf_models import PagedSession, drive_and_compare, load_hf
from mla_export.formats.contract import load_contract
from mla_export.runtime import LLMEngine, SamplingParams
from mla_export.runtime.backend import MLABackend
from runtime_models import hf_greedy

MODELS = ["deepseek_v32", "glm_moe_dsa"]
RUNTIMES = ["openvino", "onnxruntime"]
BLOCK = 4
TOL = 1e-5


@pytest.fixture(scope="module", params=MODELS)
def model(request, exports):
    ckpt, out = exports.model(request.param, "f32", BLOCK, fmt="both")
    return ckpt, out, load_hf(ckpt)


def _backend_runner(out, runtime: str, num_blocks: int):
    backend = MLABackend(load_contract(out), num_blocks, runtime=runtime, precision="f32")

    def run(feeds):
        tables = [[b for b in row if b >= 0] for row in feeds["block_tables"].tolist()]
        return backend.execute(feeds["seq_lens"].tolist(), np.diff(feeds["query_start_loc"]).tolist(), tables,
                               feeds["input_ids"]).copy()

    return run, backend


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_paged_schedule_300_tokens_matches_transformers(model, runtime, rng):
    ckpt, out, hf = model
    topk = load_contract(out).model["sparse_attention"]["index_topk"]
    run, backend = _backend_runner(out, runtime, 128)
    assert [a.shape for a in backend.kv_caches[-1:]] == [(128, BLOCK, 32)]  # an indexer-key cache, f32 rows of D
    prompts = {"a": rng.integers(2, hf.config.vocab_size, 120), "b": rng.integers(2, hf.config.vocab_size, 45),
               "c": rng.integers(2, hf.config.vocab_size, 3)}
    steps = ([[("a", 50), ("b", 45), ("c", 3)], [("a", 70), ("b", None), ("c", None)]]
             + [[("a", None), ("b", None), ("c", None)] for _ in range(60)] + [[("a", None)] for _ in range(120)])
    session = PagedSession(BLOCK, 128, rng)
    stats = drive_and_compare(run, hf, session, prompts, steps, TOL)
    assert stats["agree"] == stats["total"], f"greedy tokens differ: {stats}"
    assert len(session.tokens["a"]) > 300 > 10 * topk


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_engine_greedy_through_chunking_preemption_and_prefix_cache(model, runtime):
    ckpt, out, _ = model
    engine = LLMEngine(out, runtime=runtime, precision="f32", num_blocks=48, max_num_batched_tokens=32,
                       block_order_seed=3)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(2, engine.facts.vocab_size, n).tolist() for n in (20, 70, 90)]
    prompts.append(prompts[2][:60] + [7, 8, 9])  # 15 full blocks shared with r2: a prefix-cache hit
    params = SamplingParams(max_tokens=12, temperature=0.0)
    final, step = {}, 0
    arrivals = {0: [0, 1], 2: [2], 12: [3]}
    while arrivals or engine.has_unfinished_requests():
        for i in arrivals.pop(step, []):
            engine.add_request(f"r{i}", prompts[i], params)
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
        step += 1
        assert step < 600
    stats = engine.stats()
    assert stats["num_preemptions"] >= 1 and stats["prefix_cache_hits"] >= 1, stats
    for i, prompt in enumerate(prompts):
        assert final[f"r{i}"].token_ids == hf_greedy(ckpt, prompt, 12), f"request r{i} ({len(prompt)} prompt tokens)"


def test_int8_caches_through_the_engine(exports):
    """Both caches int8 (--kv-dtype covers the latent and the indexer-key cache): the engine with
    chunking and a small cache gives the tokens of the same export run alone, unchunked."""
    _, out = exports.model("deepseek_v32", "int8", BLOCK)
    contract = load_contract(out)
    assert contract.cache["index"]["graph_row_width"] == 32 + 16  # 32 codes + 4 f32 group scales
    params = SamplingParams(max_tokens=10, temperature=0.0)
    rng = np.random.default_rng(6)
    prompts = [rng.integers(2, 384, n).tolist() for n in (30, 75, 50)]
    busy = LLMEngine(out, precision="f32", num_blocks=40, max_num_batched_tokens=24, block_order_seed=5)
    got = {o.request_id: o.token_ids for o in _generate(busy, prompts, params)}
    alone = LLMEngine(out, precision="f32", num_blocks=64, max_num_batched_tokens=512, enable_prefix_caching=False)
    for i, prompt in enumerate(prompts):
        (want,) = _generate(alone, [prompt], params)
        assert got[f"r{i}"] == want.token_ids, f"request r{i}"


def _generate(engine, prompts, params):
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    return sorted(done, key=lambda o: o.request_id)


def test_portable_export_is_refused_naming_sparse_attention(exports, tmp_path):
    from mla_export.export import ExportError, export_model

    with pytest.raises(ExportError, match="DeepSeek Sparse Attention"):
        export_model(exports.checkpoint("deepseek_v32"), tmp_path / "out", portable=True, kv_dtype="f32")
