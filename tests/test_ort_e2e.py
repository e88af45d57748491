"""End to end on onnxruntime: exported tiny DeepSeek V3/V2 checkpoints generate greedily through
the onnxruntime executor (custom-op library, caches written in place; and the portable graph)
and agree with the OpenVINO executor and with transformers, token for token.

The step driver below batches two sequences, prefills in chunks that end mid-block and uses
shuffled block tables, so every metadata path of the graph is exercised."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

from mla_export.formats import kv_formats
from mla_export import ort_ops_path  # noqa: E402
from mla_export.runtime.cache_layout import cache_dtype  # noqa: E402
from mla_export.runtime.metadata import MLAMetadataBuilder  # noqa: E402
from mla_export.runtime.model_dir import load_model_dir  # noqa: E402

BLOCK_SIZE = 4
MAX_TOKENS = 8
CHUNK = 6  # prefill chunk: not a multiple of the block size

def _executor(kind: str, contract, caches):
    if kind == "openvino":
        from mla_export.runtime.executor_openvino import OpenVINOMLAExecutor

        return OpenVINOMLAExecutor(contract, caches, precision="f32")
    from mla_export.runtime.executor_onnxruntime import OnnxRuntimeMLAExecutor

    return OnnxRuntimeMLAExecutor(contract, caches, variant=kind, num_threads=2)


def greedy(out_dir, kind: str, prompts: list[list[int]], seed: int = 3) -> tuple[list[list[int]], object]:
    """Greedy tokens of every prompt, the prompts run side by side in one batch per step."""
    contract, facts = load_model_dir(out_dir)
    max_len = max(len(p) for p in prompts) + MAX_TOKENS
    per_seq = -(-max_len // BLOCK_SIZE)
    num_blocks = per_seq * len(prompts) + 3
    caches = [kv_formats.allocate(facts.cache_dtype, num_blocks, BLOCK_SIZE, facts.kv_lora_rank,
                                  facts.row_width - facts.kv_lora_rank) for _ in range(facts.num_layers)]
    executor = _executor(kind, contract, caches)
    builder = MLAMetadataBuilder(BLOCK_SIZE, num_blocks, facts.max_model_len, facts.vocab_size)
    # Blocks 1.. shuffled (block 0 is where the executors' start-up check writes its sentinel).
    order = np.random.default_rng(seed).permutation(np.arange(1, num_blocks)).tolist()
    tables = [order[i * per_seq:(i + 1) * per_seq] for i in range(len(prompts))]
    tokens = [list(p) for p in prompts]
    computed = [0] * len(prompts)
    generated: list[list[int]] = [[] for _ in prompts]
    while any(len(g) < MAX_TOKENS for g in generated):
        live = [i for i, g in enumerate(generated) if len(g) < MAX_TOKENS]
        counts = [min(CHUNK, len(tokens[i]) - computed[i]) for i in live]
        md = builder.build(seq_lens=[computed[i] + n for i, n in zip(live, counts)], query_lens=counts,
                           block_tables=[tables[i] for i in live],
                           new_token_ids=[tokens[i][computed[i]:computed[i] + n] for i, n in zip(live, counts)])
        logits = np.array(executor.execute(md))
        for row, (i, n) in enumerate(zip(live, counts)):
            computed[i] += n
            if computed[i] == len(tokens[i]):  # the whole known sequence is in the cache: sample
                tok = int(np.argmax(logits[row]))
                tokens[i].append(tok)
                generated[i].append(tok)
    return generated, executor


def _prompts(vocab: int, lengths=(5, 13), seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, size=n).tolist() for n in lengths]


needs_library = pytest.mark.skipif(ort_ops_path() is None,
                                   reason="the onnxruntime custom-op library libmla_export_ort.so was not built")


@needs_library
@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2"])
def test_library_path_equals_transformers(exports, model_type):
    from runtime_models import hf_greedy

    ckpt, out = exports.model(model_type, "f32", BLOCK_SIZE, "both", portable=True)
    prompts = _prompts(load_model_dir(out)[1].vocab_size)
    tokens, executor = greedy(out, "custom", prompts)
    assert "custom-op library" in executor.describe() and "in place" in executor.describe()
    for prompt, got in zip(prompts, tokens):
        expected = hf_greedy(ckpt, prompt, MAX_TOKENS)
        assert got[:len(expected)] == expected, f"prompt of {len(prompt)} tokens"


@needs_library
@pytest.mark.parametrize("kv_dtype", ["bf16", "f32"])
def test_library_and_portable_paths_equal_openvino(exports, kv_dtype):
    _, out = exports.model("deepseek_v3", kv_dtype, BLOCK_SIZE, "both", portable=True)
    prompts = _prompts(load_model_dir(out)[1].vocab_size, lengths=(9, 3), seed=2)
    expected, _ = greedy(out, "openvino", prompts)
    got_custom, ex_custom = greedy(out, "custom", prompts)
    got_portable, ex_portable = greedy(out, "portable", prompts)
    assert got_custom == expected
    assert got_portable == expected
    assert "model_portable.onnx" in ex_portable.describe() and "copied back" in ex_portable.describe()


@needs_library
@pytest.mark.parametrize("kv_dtype", ["f16", "int8", "fp8", "e5m2"])
def test_new_cache_formats_equal_openvino(tmp_path_factory, kv_dtype, exports):
    """The f16 / int8 / fp8 / e5m2 caches through the onnxruntime library give OpenVINO's greedy tokens
    (the same kernels on the same stored rows); f16 also through the portable graph, which
    cannot hold quantised rows (no bit-cast in standard ONNX): the export refuses --portable."""
    if kv_dtype == "f16":
        _, out = exports.model("deepseek_v3", kv_dtype, BLOCK_SIZE, "both", portable=True)
    else:
        from mla_export.cli import main

        ckpt, _ = exports.model("deepseek_v3", "f32", BLOCK_SIZE, "both", portable=True)
        out = tmp_path_factory.mktemp(f"ort_{kv_dtype}") / "export"
        assert main(["export", str(ckpt), "-o", str(out), "--format", "both", "--portable", "--block-size",
                     str(BLOCK_SIZE), "--kv-dtype", kv_dtype, "-q"]) != 0  # refused: nothing written
        assert not out.exists()
        assert main(["export", str(ckpt), "-o", str(out), "--format", "both", "--block-size", str(BLOCK_SIZE),
                     "--kv-dtype", kv_dtype, "-q"]) == 0
    prompts = _prompts(load_model_dir(out)[1].vocab_size, lengths=(9, 3), seed=2)
    expected, _ = greedy(out, "openvino", prompts)
    assert greedy(out, "custom", prompts)[0] == expected
    if kv_dtype == "f16":
        assert greedy(out, "portable", prompts)[0] == expected


@needs_library
def test_library_path_writes_the_callers_cache_arrays(exports):
    """After a prefill the prompt's rows are in the caller's numpy arrays (no write-back exists
    on this path: if onnxruntime copied the cache, the rows would stay zero), and only there."""
    _, out = exports.model("deepseek_v3", "bf16", BLOCK_SIZE, "both", portable=True)
    contract, facts = load_model_dir(out)
    nb = 8
    caches = [np.zeros((nb, BLOCK_SIZE, facts.row_width), cache_dtype("bf16")) for _ in range(facts.num_layers)]
    ptrs = [c.ctypes.data for c in caches]
    executor = _executor("custom", contract, caches)
    builder = MLAMetadataBuilder(BLOCK_SIZE, nb, facts.max_model_len, facts.vocab_size)
    prompt = [7, 8, 9, 10, 11, 12]  # 6 rows: block 5 full, block 2 half
    executor.execute(builder.build([6], [6], [[5, 2]], [prompt]))
    for layer, cache in enumerate(caches):
        assert cache.ctypes.data == ptrs[layer]
        rows = cache.astype(np.float32)
        assert np.all(np.any(rows[5] != 0, axis=-1)), f"layer {layer}: block 5 not written"
        assert np.all(np.any(rows[2, :2] != 0, axis=-1)) and np.all(rows[2, 2:] == 0), f"layer {layer}: block 2"
        others = np.delete(rows, [2, 5], axis=0)
        assert np.all(others == 0), f"layer {layer}: rows outside the sequence's slots were written"


def test_portable_fallback_is_chosen_and_said_without_the_library(exports, monkeypatch):
    """With the library absent, variant "auto" runs the portable graph and says why."""
    from mla_export.runtime import executor_onnxruntime as eo

    _, out = exports.model("deepseek_v3", "f32", BLOCK_SIZE, "both", portable=True)
    contract, _ = load_model_dir(out)
    monkeypatch.setattr(eo, "ort_ops_path", lambda: None)
    assert eo.choose_variant(contract, "auto") == ("portable", "portable ONNX functions (libmla_export_ort.so is not installed)")
    with pytest.raises(FileNotFoundError, match="libmla_export_ort.so"):
        eo.choose_variant(contract, "custom")


@needs_library
def test_llm_runtime_onnxruntime_equals_openvino(exports):
    from mla_export.runtime import LLM

    _, out = exports.model("deepseek_v3", "bf16", BLOCK_SIZE, "both", portable=True)
    prompts = _prompts(load_model_dir(out)[1].vocab_size, lengths=(4, 11, 6), seed=5)
    ov = LLM(out, runtime="openvino", precision="f32", num_blocks=32).generate(prompts, max_tokens=MAX_TOKENS, temperature=0.0)
    ort_llm = LLM(out, runtime="onnxruntime", num_blocks=32)
    ort = ort_llm.generate(prompts, max_tokens=MAX_TOKENS, temperature=0.0)
    assert [o.token_ids for o in ort] == [o.token_ids for o in ov]
    assert "custom-op library" in ort_llm.engine.executor.describe()
