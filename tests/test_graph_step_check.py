"""The bad steps of issue 14, one by one, on both runtimes (OpenVINO IR on two threads and on
one, where the executor runs the same check before infer(); model.onnx in onnxruntime with the
custom-op library): each is rejected by the graph's step check with a
message naming the input, before any cache byte moves. f32 caches, block size 4, tiny model.
(test_graph_fuzz.py covers thousands of random ones.)"""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.runtime.metadata import MLAMetadata, MLAMetadataBuilder
from mla_export.runtime.model_dir import load_model_dir
from test_graph_fuzz import BLOCK_SIZE, NUM_BLOCKS, _caches

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def setup(exports):
    from mla_export.ops import kernels
    from mla_export.runtime.executor_onnxruntime import OnnxRuntimeMLAExecutor
    from mla_export.runtime.executor_openvino import OpenVINOMLAExecutor

    if not kernels.available("onnxruntime"):
        pytest.skip("the onnxruntime custom-op library is not built")
    out = exports.model("deepseek_v3", "f32", BLOCK_SIZE, "both")[1]
    contract, _ = load_model_dir(out)
    rng = np.random.default_rng(1)
    runtimes = {}
    for kind in ("openvino", "openvino-1-thread", "onnxruntime"):
        caches = _caches(contract, rng)
        if kind.startswith("openvino"):  # one thread: the executor's pre-check (see executor_openvino)
            ex = OpenVINOMLAExecutor(contract, caches, precision="f32", num_threads=1 if "1" in kind else 2)
        else:
            ex = OnnxRuntimeMLAExecutor(contract, caches, variant="custom", num_threads=2)
        runtimes[kind] = (ex, caches)
    builder = MLAMetadataBuilder(BLOCK_SIZE, NUM_BLOCKS, contract.model["max_position_embeddings"],
                                 contract.model["vocab_size"])
    # Two sequences: a chunked prefill (6 cached + 5 new) and a decode; distinct blocks.
    good = builder.build([11, 9], [5, 1], [[3, 7, 12], [20, 21, 22]], [[1, 2, 3, 4, 5], [6]]).feeds()
    return runtimes, good, contract.model


def _with(good, **change):
    f = {k: v.copy() for k, v in good.items()}
    for k, v in change.items():
        f[k] = np.asarray(v(f[k]) if callable(v) else v, dtype=np.int32)
    return f


CASES = {
    "id >= vocab": (lambda m: dict(input_ids=lambda a: np.where(np.arange(a.size) == 2, m["vocab_size"], a)), "input_ids"),
    "negative id": (lambda m: dict(input_ids=lambda a: np.where(np.arange(a.size) == 0, -1, a)), "input_ids"),
    "input_ids too long": (lambda m: dict(input_ids=lambda a: np.append(a, 1)), "input_ids"),
    "position past the RoPE table": (lambda m: dict(positions=lambda a: np.where(np.arange(a.size) == 5,
                                                                                  m["max_position_embeddings"] + 3, a)),
                                     "positions"),
    "positions too short": (lambda m: dict(positions=lambda a: a[:-1]), "positions"),
    "logits_indices >= T": (lambda m: dict(logits_indices=lambda a: np.array([4, 6])), "logits_indices"),
    "write into another sequence's block": (lambda m: dict(slot_mapping=lambda a: np.where(
        np.arange(a.size) == 0, 20 * BLOCK_SIZE + 2, a)), "slot_mapping"),  # token 0 is sequence 0's
    "block id out of range": (lambda m: dict(block_tables=lambda a: np.where(a == 22, NUM_BLOCKS + 5, a)),
                              "block_tables"),
    "another sequence's block in the table": (lambda m: dict(block_tables=lambda a: np.where(a == 21, 12, a)),
                                              "block_tables"),
    "seq_lens beyond the table": (lambda m: dict(seq_lens=lambda a: a + np.array([0, 4 * BLOCK_SIZE])), "seq_lens"),
    "batch sizes disagree": (lambda m: dict(seq_lens=lambda a: a[:1]), "query_start_loc"),
}


@pytest.mark.parametrize("kind", ["openvino", "openvino-1-thread", "onnxruntime"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_step_is_named_and_changes_nothing(setup, kind, case):
    runtimes, good, model = setup
    ex, caches = runtimes[kind]
    change, name = CASES[case]
    bad = _with(good, **change(model))
    before = [c.copy() for c in caches]
    with pytest.raises(Exception) as e:
        ex.execute(MLAMetadata(**bad))
    msg = str(e.value)
    assert "MlaStepCheck" in msg and name in msg, msg[-500:]
    assert all(np.array_equal(b.view(np.uint32), c.view(np.uint32)) for b, c in zip(before, caches))
    assert np.isfinite(np.array(ex.execute(MLAMetadata(**good)))).all()  # and the good step still runs


def test_read_only_caches_are_refused(tmp_path):
    from mla_export.ops import kernels

    if not kernels.available("onnxruntime"):
        pytest.skip("the onnxruntime custom-op library is not built")
    cache = np.zeros((2, 4, 8), np.float32)
    cache.flags.writeable = False
    kv_c, k_pe, slots = np.ones((1, 6), np.float32), np.ones((1, 2), np.float32), np.array([1], np.int32)
    with pytest.raises(ValueError, match="read-only"):
        kernels.cache_write(kv_c, k_pe, cache, slots, runtime="onnxruntime")
    assert not cache.any()  # not written behind numpy's back
    path = tmp_path / "cache.bin"
    np.zeros((2, 4, 8), np.float32).tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r", shape=(2, 4, 8))
    with pytest.raises(ValueError, match="read-only"):  # was a segmentation fault
        kernels.cache_write(kv_c, k_pe, mapped, slots, runtime="onnxruntime")
