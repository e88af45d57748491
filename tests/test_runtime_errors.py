"""Bad input to the runtime: each a clear error, raised before anything runs."""

from __future__ import annotations

import json
import shutil

import openvino as ov
import pytest

from mla_export.formats.contract_error import ContractError
from mla_export.runtime import LLM, LLMEngine, SamplingParams
from mla_export.runtime import executor_openvino


@pytest.fixture(scope="module")
def out_dir(exports):
    return exports.model("deepseek_v3", "f32", 4)[1]


@pytest.fixture(scope="module")
def engine(out_dir):
    return LLMEngine(out_dir, precision="f32", num_blocks=8)


def test_missing_directory_or_contract(tmp_path):
    with pytest.raises(ContractError, match="not a directory"):
        LLMEngine(tmp_path / "nowhere")
    with pytest.raises(ContractError, match="mla_graph.json: not found"):
        LLMEngine(tmp_path)


def test_contract_that_contradicts_itself(out_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(out_dir, bad)
    raw = json.loads((bad / "mla_graph.json").read_text())
    raw["model"]["num_layers"] += 1
    (bad / "mla_graph.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="num_layers"):
        LLMEngine(bad)


def test_contract_that_does_not_match_the_graph(out_dir, tmp_path):
    # A consistent contract for block size 8, next to a graph exported for block size 4.
    bad = tmp_path / "bad"
    shutil.copytree(out_dir, bad)
    raw = json.loads((bad / "mla_graph.json").read_text())
    raw["cache"]["block_size"] = 8
    for spec in raw["inputs"]:
        if spec["name"].startswith("kv_cache."):
            spec["shape"][1] = 8
    (bad / "mla_graph.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="kv_cache.0"):
        LLMEngine(bad)


def test_unknown_runtime_and_precision(out_dir):
    with pytest.raises(ValueError, match="runtime"):
        LLMEngine(out_dir, runtime="tensorrt")
    with pytest.raises(ValueError, match="precision"):
        LLMEngine(out_dir, precision="f16")
    with pytest.raises(ValueError, match="not both"):
        LLMEngine(out_dir, num_blocks=4, kv_cache_memory=1 << 20)


def test_prompts_longer_than_context_or_cache(engine):
    context = engine.max_model_len
    with pytest.raises(ValueError, match="context"):
        engine.add_request("long", [5] * (context + 1), SamplingParams(max_tokens=1))
    # 8 blocks of 4 rows: the context is what the cache holds (32 rows, max_model_len's default),
    # so 30 prompt tokens + 5 generated are cut at the context instead of refused.
    assert context == 8 * 4
    assert not engine.has_unfinished_requests()


def test_bad_prompts_and_params(engine, out_dir):
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("e", [], SamplingParams())
    with pytest.raises(ValueError, match="token ids must lie"):
        engine.add_request("v", [engine.facts.vocab_size], SamplingParams())
    with pytest.raises(ValueError, match="flat sequence"):
        engine.add_request("f", [[1, 2]], SamplingParams())
    with pytest.raises(TypeError, match="SamplingParams"):
        engine.add_request("p", [1, 2], {"max_tokens": 3})
    engine.add_request("dup", [3, 4], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("dup", [3, 4], SamplingParams(max_tokens=1))
    engine.abort_request("dup")
    llm = LLM(engine=engine)  # over the shared engine (compiling another costs seconds)
    with pytest.raises(ValueError, match="not both"):
        LLM("somewhere", engine=engine)
    with pytest.raises(TypeError, match="must be an LLMEngine"):
        LLM(engine=object())
    with pytest.raises(ValueError, match="temperature"):
        llm.generate([[1, 2]], temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        llm.generate([[1, 2]], top_k=-2)
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate([[1, 2]], sampling_params=[SamplingParams(), SamplingParams()])
    assert engine.stats()["kv_blocks_used"] == 0 and not engine.has_unfinished_requests()


def test_a_cache_the_plugin_copies_is_refused(out_dir, monkeypatch):
    # Bind each cache as a private copy, as the plugin does behind a Convert: the start-up
    # sentinel step must notice that the numpy arrays were not written.
    from mla_export.runtime import decode_graphs

    real = decode_graphs.shared_tensor
    monkeypatch.setattr(decode_graphs, "shared_tensor", lambda arr: ov.Tensor(arr, shared_memory=False))
    with pytest.raises(executor_openvino.CacheNotInPlaceError, match="not write kv_cache.0"):
        LLMEngine(out_dir, precision="f32", num_blocks=8)
    # Only the static decode graphs' caches copied (the dynamic graph's shared): the sentinel step
    # on the batch-1 graph notices.
    made = []

    def second_graph_copies(arr):
        return ov.Tensor(arr, shared_memory=False) if len(made) > 1 else real(arr)

    init = decode_graphs.CompiledGraph.__init__
    monkeypatch.setattr(decode_graphs.CompiledGraph, "__init__", lambda self, *a: made.append(self) or init(self, *a))
    monkeypatch.setattr(decode_graphs, "shared_tensor", second_graph_copies)
    with pytest.raises(executor_openvino.CacheNotInPlaceError, match="not write kv_cache.0"):
        LLMEngine(out_dir, precision="f32", num_blocks=8, decode_graph_batches=[1])
    assert len(made) == 2
