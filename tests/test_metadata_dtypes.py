"""Issue 36, cause 4 and part of 8: values that a cast to int32 would change are refused, naming
the input, on every runtime (OpenVINO on one and two threads, onnxruntime with the custom-op
library), and both runtimes check an op's `compute` attribute the same way.

- The executors: a step's metadata enters through runtime/graph_feeds.py. An int64 token id or
  slot of 2**32 + k used to run as k, a float position was truncated: each is now a ValueError
  naming the input, no cache byte moves, and the same step in int64 (values in range) still runs
  with the int32 step's logits. A wrong rank names the input on OpenVINO's two threads too (the
  plugin's own shape check said only "Can not clone with new dims").
- The ops: OpenVINO's CPU plugin narrows an i64 model input to i32 before any op runs, so an i64
  expert id of 2**32 + k reached MlaMoeExperts as k; the ops now read past that Convert and their
  own range check refuses it, as onnxruntime's does (MlaCacheWrite's slot_mapping likewise).
- `compute=""` was accepted by onnxruntime (as f32) and refused by OpenVINO.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from mla_export.runtime.metadata import METADATA_INPUTS, MLAMetadata, MLAMetadataBuilder
from mla_export.runtime.model_dir import load_model_dir
from test_graph_fuzz import BLOCK_SIZE, NUM_BLOCKS, _caches
from test_moe_experts_op import _case, _model
from test_qlinear_op import _case as _qlinear_case, _model as _qlinear_model

pytest.importorskip("onnxruntime")

KINDS = ["openvino-2-threads", "openvino-1-thread", "onnxruntime"]


def _need_ort_library():
    from mla_export.ops import kernels

    if not kernels.available("onnxruntime"):
        pytest.skip("the onnxruntime custom-op library is not built")


@pytest.fixture(scope="module")
def executors(exports):
    from mla_export.runtime.executor_onnxruntime import OnnxRuntimeMLAExecutor
    from mla_export.runtime.executor_openvino import OpenVINOMLAExecutor

    _need_ort_library()
    contract, _ = load_model_dir(exports.model("deepseek_v3", "f32", BLOCK_SIZE, "both")[1])
    rng = np.random.default_rng(5)
    out = {}
    for kind in KINDS:
        caches = _caches(contract, rng)
        if kind.startswith("openvino"):
            ex = OpenVINOMLAExecutor(contract, caches, precision="f32", num_threads=1 if "1" in kind else 2)
        else:
            ex = OnnxRuntimeMLAExecutor(contract, caches, variant="custom", num_threads=2)
        out[kind] = (ex, caches)
    builder = MLAMetadataBuilder(BLOCK_SIZE, NUM_BLOCKS, contract.model["max_position_embeddings"],
                                 contract.model["vocab_size"])
    # a chunked prefill (6 cached + 5 new) and a decode, on distinct blocks
    good = builder.build([11, 9], [5, 1], [[3, 7, 12], [20, 21, 22]], [[1, 2, 3, 4, 5], [6]]).feeds()
    return out, good


def _refused_without_a_trace(executors, kind, feeds, *patterns):
    runtimes, good = executors
    ex, caches = runtimes[kind]
    before = [c.copy() for c in caches]
    with pytest.raises(ValueError) as e:
        ex.execute(MLAMetadata(**feeds))
    msg = str(e.value)
    assert all(p in msg for p in patterns), msg
    assert all(np.array_equal(b.view(np.uint32), c.view(np.uint32)) for b, c in zip(before, caches))
    assert np.isfinite(np.array(ex.execute(MLAMetadata(**good)))).all()  # the executor still runs


def _plus(a: np.ndarray, at: int, delta: int) -> np.ndarray:
    """`a` as int64 with `delta` added at flat index `at`."""
    out = a.astype(np.int64)
    out.reshape(-1)[at] += delta
    return out


# (name, how the value is spoiled, what the message must hold). Each int64 value wraps, cast to
# int32, onto the valid value it replaced: before the fix every one of these steps ran.
WRAPPING = {
    "token id 2**32 + k": ("input_ids", lambda a: _plus(a, 2, 2**32), ["'input_ids'", str(3 + 2**32), "run as 3"]),
    "slot 2**32 + k": ("slot_mapping", lambda a: _plus(a, 1, 2**32), ["'slot_mapping'", "int32 range"]),
    "slot -2**32 + k": ("slot_mapping", lambda a: _plus(a, 0, -2**32), ["'slot_mapping'", "int32 range"]),
    "block id 2**33 + k": ("block_tables", lambda a: _plus(a, 4, 2**33), ["'block_tables'", "int32 range"]),
    "seq_len 2**32 + k (uint64)": ("seq_lens", lambda a: _plus(a, 1, 2**32).astype(np.uint64),
                                   ["'seq_lens'", "int32 range"]),
    "float positions": ("positions", lambda a: a.astype(np.float64) + 0.25, ["'positions'", "integers", "float64"]),
    "whole float positions": ("positions", lambda a: a.astype(np.float32), ["'positions'", "float32"]),
    "bool logits_indices": ("logits_indices", lambda a: np.ones(a.shape, bool), ["'logits_indices'", "bool"]),
}


@pytest.mark.parametrize("kind", KINDS)
class TestMetadataIsNeverCastLossily:
    """Cause 4 in the executors: one check where the metadata enters (runtime/graph_feeds.py)."""

    @pytest.mark.parametrize("case", list(WRAPPING))
    def test_a_value_the_cast_would_change_is_refused(self, executors, kind, case):
        name, spoil, patterns = WRAPPING[case]
        feeds = dict(executors[1])
        feeds[name] = spoil(feeds[name])
        _refused_without_a_trace(executors, kind, feeds, *patterns)

    def test_int64_metadata_in_range_runs_as_int32(self, executors, kind):
        runtimes, good = executors
        ex, _ = runtimes[kind]
        # the step writes its rows again, the same values: the caches end as they were
        want = np.array(ex.execute(MLAMetadata(**good)))
        wide = {k: v.astype(np.int64) for k, v in good.items()}
        np.testing.assert_array_equal(np.array(ex.execute(MLAMetadata(**wide))), want)


RANKS = {
    "block_tables rank 1": ("block_tables", lambda a: a.reshape(-1), "rank 2"),
    "seq_lens rank 2": ("seq_lens", lambda a: a.reshape(1, -1), "rank 1"),
    "input_ids rank 0": ("input_ids", lambda a: a[0], "rank 1"),
    "logits_indices rank 2": ("logits_indices", lambda a: a.reshape(-1, 1), "rank 1"),
}


@pytest.mark.parametrize("kind", KINDS)
class TestWrongRankMetadataNamesTheInput:
    """Part of cause 8: on two threads OpenVINO's plugin refused a wrong rank itself, before any
    node ran ("Can not clone with new dims", no input named); one thread (the executor's
    pre-check) and onnxruntime named it. Now one check names it on all three."""

    @pytest.mark.parametrize("case", list(RANKS))
    def test_named(self, executors, kind, case):
        name, spoil, rank = RANKS[case]
        feeds = dict(executors[1])
        feeds[name] = spoil(feeds[name])
        _refused_without_a_trace(executors, kind, feeds, f"'{name}'", rank)


# ---------------------------------------------------------------------------------- the ops
OP_RUNTIMES = {"openvino-2-threads": 2, "openvino-1-thread": 1, "onnxruntime": None}


def _run(model, feeds: dict, runtime: str) -> list[np.ndarray]:
    """The ONNX model on one runtime; op errors raised even where OpenVINO's plugin loses them."""
    if runtime == "onnxruntime":
        import onnxruntime as ort

        from mla_export import ort_ops_path

        _need_ort_library()
        so = ort.SessionOptions()
        so.register_custom_ops_library(ort_ops_path())
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    if runtime == "openvino-1-thread":
        return _run_in_child(model, feeds)
    return run_openvino(model, feeds, 2)


def run_openvino(model, feeds: dict, threads: int) -> list[np.ndarray]:
    import openvino as ov

    from mla_export import ov_core
    from mla_export.ops.ov_op_errors import checked_infer

    core = ov_core()
    compiled = core.compile_model(core.read_model(model.SerializeToString()), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    for name, value in feeds.items():  # shared: MlaCacheWrite writes the caller's cache in place
        request.set_tensor(name, ov.Tensor(value, shared_memory=True))
    checked_infer(request)
    return [request.get_output_tensor(i).data.copy() for i in range(len(compiled.outputs))]


_CHILD = """
import sys
import numpy as np, onnx
sys.path.insert(0, sys.argv[1])
from test_metadata_dtypes import run_openvino
feeds = dict(np.load(sys.argv[3]))
try:
    outs = run_openvino(onnx.load(sys.argv[2]), feeds, 1)
except Exception as e:
    print("OP-ERROR " + " ".join(str(e).split()))
    outs = []
np.savez(sys.argv[4], *outs, **{"feed." + k: v for k, v in feeds.items()})
"""


def _run_in_child(model, feeds: dict) -> list[np.ndarray]:
    """OpenVINO on one thread, in a child process: there the CPU plugin (2026.4.1) loses an op's
    exception, and a later one-thread infer() in the same process crashed (docs/SAFETY.md). The
    feeds come back too (a cache the op wrote in place is copied into the caller's array)."""
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, n) for n in ("model.onnx", "feeds.npz", "out.npz")]
        with open(paths[0], "wb") as f:
            f.write(model.SerializeToString())
        np.savez(paths[1], **feeds)
        proc = subprocess.run([sys.executable, "-c", _CHILD, os.path.dirname(__file__), *paths],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        with np.load(paths[2]) as out:
            for name, value in feeds.items():
                np.copyto(value, out["feed." + name])
            outs = [out[f"arr_{i}"] for i in range(sum(k.startswith("arr_") for k in out.files))]
    error = [line for line in proc.stdout.splitlines() if line.startswith("OP-ERROR ")]
    if error:
        raise RuntimeError(error[0][len("OP-ERROR "):])
    return outs


def _moe(rng):
    weights, feeds, want = _case(rng, 8, 64, 32, 2, 4, (8, 8), None)
    return weights, feeds, want


@pytest.mark.parametrize("runtime", list(OP_RUNTIMES))
class TestOpsReadInt64IndicesAsGiven:
    """Cause 4 in the ops: an i64 index that does not fit int32 is refused by the op's own check
    on OpenVINO as on onnxruntime (OpenVINO used to narrow it first: 2**32 + 1 ran as expert 1)."""

    @pytest.mark.parametrize("bad", [2**32 + 1, -2**32 + 3, 2**31 + 1])
    def test_moe_expert_id_beyond_int32(self, rng, runtime, bad):
        weights, feeds, _ = _moe(rng)
        feeds["ids"] = feeds["ids"].astype(np.int64)
        feeds["ids"][1, 0] = bad
        with pytest.raises(Exception, match=rf"MlaMoeExperts: input 'topk_ids' holds expert id {bad} outside \[0, 8\)"):
            _run(_model(64, (8, 8), weights), feeds, runtime)

    def test_moe_int64_ids_in_range_match_int32(self, rng, runtime):
        weights, feeds, want = _moe(rng)
        model = _model(64, (8, 8), weights)
        got = _run(model, dict(feeds, ids=feeds["ids"].astype(np.int64)), runtime)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())

    def test_cache_write_slot_beyond_int32_writes_nothing(self, runtime):
        # the same read of i64 indices in every op: MlaCacheWrite's slot_mapping
        rows, width = 3, 24
        node = helper.make_node("MlaCacheWrite", ["kv_c", "k_pe", "kv_cache", "slots"], ["written"],
                                domain="mla_export")
        graph = helper.make_graph(
            [node], "cw", [helper.make_tensor_value_info("kv_c", TensorProto.FLOAT, [None, 16]),
                           helper.make_tensor_value_info("k_pe", TensorProto.FLOAT, [None, 8]),
                           helper.make_tensor_value_info("kv_cache", TensorProto.FLOAT, [None, None, width]),
                           helper.make_tensor_value_info("slots", TensorProto.INT64, [None])],
            [helper.make_tensor_value_info("written", TensorProto.INT32, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("mla_export", 1)])
        cache = np.zeros((2, 4, width), np.float32)
        feeds = dict(kv_c=np.ones((rows, 16), np.float32), k_pe=np.ones((rows, 8), np.float32), kv_cache=cache)
        with pytest.raises(Exception, match=r"'slot_mapping'.*slot 4294967297"):
            _run(model, dict(feeds, slots=np.array([0, 2**32 + 1, 2], np.int64)), runtime)
        assert not cache.any()
        _run(model, dict(feeds, slots=np.array([0, 1, 2], np.int64)), runtime)
        if runtime != "onnxruntime":  # OpenVINO writes the shared numpy cache (onnxruntime writes its copy of it)
            assert cache[0, :3].all() and not cache[0, 3:].any() and not cache[1].any()


@pytest.mark.parametrize("runtime", list(OP_RUNTIMES))
class TestComputeAttributeOneCheck:
    """Part of cause 8: both runtimes check `compute` with the kernels' one function; absent is
    f32, and a present value must be exactly "f32" or "bf16" (onnxruntime took "" as f32)."""

    @pytest.mark.parametrize("compute", ["", "F32", "fp32"])
    def test_refused_alike(self, rng, runtime, compute):
        weights, feeds, _ = _moe(rng)
        with pytest.raises(Exception, match=f"MlaMoeExperts: attribute 'compute' must be f32 or bf16, got '{compute}'"):
            _run(_model(64, (8, 8), weights, compute=compute), feeds, runtime)

    def test_qlinear_refuses_empty_alike(self, rng, runtime):
        weights, _ = _qlinear_case(rng, 32, 64, 8, None)
        x = rng.standard_normal((2, 64)).astype(np.float32)
        with pytest.raises(Exception, match="MlaQLinear: attribute 'compute' must be f32 or bf16, got ''"):
            _run(_qlinear_model(64, 32, weights, 8, compute=""), {"x": x}, runtime)

    def test_absent_is_f32(self, rng, runtime):
        weights, feeds, want = _moe(rng)
        got = _run(_model(64, (8, 8), weights), feeds, runtime)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
