"""MlaMoeExperts, the fused MoE op (custom_ops/kernels/moe_experts.hpp), in both runtimes, f32.

Against the float64 reference (mla_export.ops.reference.moe_experts) on the weights the codes decode
to: random shapes, int8 / int4 / mixed projections, shuffled expert ids, tokens routed so that
some experts get many tokens (the dequantised-panel path, >= 8) and others few (dot products on
the codes), bf16 activations (every vector table this CPU has: tests/test_ops_isa.py). Then the
boundary: bad ids, shapes, types and zero points fail with a message naming the input.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernel_paths import cpu_has, int8_activations
from mla_export.ops import reference as ref
from mla_export.export.quantize import (deinterleave_rows4, dequantize, interleave_rows4, moe_operands, pack_u4_halves,
                                        quantize, unpack_u4_halves)

NAMES = ["w13_q", "w13_s", "w13_zp", "w2_q", "w2_s", "w2_zp"]
TOL = 2e-5  # f32 accumulation against float64, relative to the output's largest value


def _model(hidden: int, bits: tuple[int, int], weights: list[np.ndarray], x_type=TensorProto.FLOAT,
           compute: str | None = None, layout: str | None = None):
    inits = [numpy_helper.from_array(np.ascontiguousarray(a), n) for a, n in zip(weights, NAMES)]
    extra = {} if compute is None else {"compute": compute}
    if layout is not None:
        extra["layout"] = layout
    node = helper.make_node("MlaMoeExperts", ["x", "ids", "wts"] + NAMES, ["y"], domain="mla_export",
                            w13_bits=bits[0], w2_bits=bits[1], **extra)
    graph = helper.make_graph(
        [node], "moe", [helper.make_tensor_value_info("x", x_type, [None, hidden]),
                        helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None]),
                        helper.make_tensor_value_info("wts", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mla_export", 1)])


def _run_openvino(model, feeds):
    from mla_export import ov_core

    core = ov_core()
    compiled = core.compile_model(core.read_model(model.SerializeToString()), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2})
    return compiled(feeds)[0]


def _run_onnxruntime(model, feeds):
    import onnxruntime as ort

    from mla_export import ort_ops_path

    lib = ort_ops_path()
    if lib is None:
        pytest.skip("the onnxruntime custom-op library was not built (no onnxruntime headers)")
    so = ort.SessionOptions()
    so.register_custom_ops_library(lib)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


RUNTIMES = {"openvino": _run_openvino, "onnxruntime": _run_onnxruntime}


def _case(rng, experts, hidden, inter, k, tokens, bits, group):
    return _case_full(rng, experts, hidden, inter, k, tokens, bits, group)[:3]


def _case_full(rng, experts, hidden, inter, k, tokens, bits, group):
    """(op weights, feeds, reference output, the dequantised (w13, w2))."""
    w13 = (rng.standard_normal((experts, 2 * inter, hidden)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((experts, hidden, inter)) * 0.1).astype(np.float32)
    q13 = quantize(w13, bits[0], group if bits[0] == 4 else None)
    q2 = quantize(w2, bits[1], group if bits[1] == 4 else None)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    # skewed routing: expert 0 (or a shuffled favourite) takes most tokens, the rest are random
    favourite = rng.permutation(experts)[:2]
    ids = np.stack([np.concatenate([favourite[:1], rng.permutation(np.setdiff1d(np.arange(experts), favourite[:1]))[:k - 1]])
                    if rng.random() < 0.7 else rng.permutation(experts)[:k] for _ in range(tokens)]).astype(np.int64)
    wts = rng.random((tokens, k)).astype(np.float32)
    weights = list(moe_operands(q13)) + list(moe_operands(q2))
    want = ref.moe_experts(x, ids, wts, dequantize(q13), dequantize(q2))
    return weights, {"x": x, "ids": ids, "wts": wts}, want, (dequantize(q13), dequantize(q2))


SHAPES = [  # experts, hidden, inter, k, tokens, bits (w13, w2), int4 group
    (8, 64, 32, 2, 1, (8, 8), None),
    (8, 64, 32, 3, 5, (4, 4), 32),
    (6, 128, 64, 2, 40, (4, 4), 64),
    (6, 96, 64, 2, 23, (8, 4), 32),
    (4, 256, 96, 2, 70, (4, 8), 32),
    (16, 128, 32, 4, 3, (8, 8), None),
    (4, 64, 32, 2, 600, (8, 8), None),  # ~300 pairs an expert: runs of 256 (kQLinearRowBlock) and the rest
    (3, 64, 64, 2, 500, (4, 4), 32),
]


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "E{}-H{}-I{}-k{}-T{}-b{}{}".format(*s[:5], *s[5]))
def test_matches_reference(rng, runtime, shape):
    weights, feeds, want = _case(rng, *shape)
    got = RUNTIMES[runtime](_model(shape[1], shape[5], weights), feeds)
    assert got.shape == want.shape
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < TOL, f"{runtime} {shape}: max rel error {err:.2e}"


@pytest.mark.parametrize("tokens", [3, 40], ids=["few-per-expert", "many-per-expert"])
def test_sums_do_not_depend_on_the_thread_count(rng, tokens):
    """Each output element sums its experts in ascending order however the columns are split among
    threads (every expert with few tokens: each core walks its columns expert by expert; one with
    many: items handed out one by one): 1 and 2 threads agree bit for bit."""
    from mla_export import ov_core

    weights, feeds, _ = _case(rng, 16, 128, 64, 4, tokens, (8, 8), None)
    model = _model(128, (8, 8), weights)
    core = ov_core()
    outs = [core.compile_model(core.read_model(model.SerializeToString()), "CPU",
                               {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": n})(feeds)[0]
            for n in (1, 2)]
    assert np.isfinite(outs[0]).all()
    assert np.array_equal(outs[0], outs[1])


def test_zero_tokens_and_half_activations(rng):
    weights, feeds, want = _case(rng, 8, 64, 32, 2, 9, (4, 4), 32)
    empty = {"x": feeds["x"][:0], "ids": feeds["ids"][:0], "wts": feeds["wts"][:0]}
    assert _run_openvino(_model(64, (4, 4), weights), empty).shape == (0, 64)
    # onnxruntime passes f16 activations as given: the op widens them (the CPU plugin hands it bf16
    # ones under a bf16 hint; the same conversion path)
    x16 = feeds["x"].astype(np.float16)
    want16 = ref.moe_experts(x16.astype(np.float32), feeds["ids"], feeds["wts"],
                             *[dequantize(q) for q in _requantized(weights)])
    got = _run_onnxruntime(_model(64, (4, 4), weights, TensorProto.FLOAT16), dict(feeds, x=x16))
    assert np.abs(got - want16).max() / np.abs(want16).max() < TOL


def _requantized(weights):
    """The Quantized pair that `weights` (moe_operands of int4 codes) hold."""
    from mla_export.export.quantize import Quantized

    out = []
    for q, s, z in (weights[:3], weights[3:]):
        codes = unpack_u4_halves(deinterleave_rows4(q))
        groups = s.shape[-1]
        out.append(Quantized(4, codes.shape[-1] // groups, codes.reshape(codes.shape[:-1] + (groups, -1)),
                             z[..., None], s[..., None]))
    return out


def test_int4_layout_roundtrip(rng):
    codes = rng.integers(0, 16, (3, 5, 64)).astype(np.uint8)
    packed = pack_u4_halves(codes)
    assert packed.shape == (3, 5, 32)
    assert packed[0, 0, 0] == codes[0, 0, 0] | (codes[0, 0, 16] << 4)  # input j low, j + 16 high
    assert np.array_equal(unpack_u4_halves(packed), codes)
    rows = rng.integers(0, 256, (2, 8, 48)).astype(np.uint8)
    mixed = interleave_rows4(rows)
    assert np.array_equal(mixed[0].reshape(-1)[16:32], rows[0, 1, :16])  # chunk 0 of row 1 follows row 0's
    assert np.array_equal(mixed[1].reshape(-1)[64:80], rows[1, 0, 16:32])  # then chunk 1 of row 0
    assert np.array_equal(deinterleave_rows4(mixed), rows)


BAD = [
    ("ids", lambda f, w: f.update(ids=np.where(f["ids"] == f["ids"][0, 0], 99, f["ids"])), "topk_ids.*outside"),
    ("ids", lambda f, w: f.update(ids=f["ids"][:, :1]), "topk_weights"),
    ("x", lambda f, w: f.update(x=f["x"][:, :32]), "x"),
]


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("bad", BAD, ids=[b[0] + str(i) for i, b in enumerate(BAD)])
def test_bad_inputs_name_the_input(rng, runtime, bad):
    name, spoil, pattern = bad
    weights, feeds, _ = _case(rng, 8, 64, 32, 2, 4, (8, 8), None)
    spoil(feeds, weights)
    model = _model(64, (8, 8), weights)
    with pytest.raises(Exception, match=pattern):
        RUNTIMES[runtime](model, feeds)


def test_bad_weights_name_the_input(rng):
    weights, feeds, _ = _case(rng, 8, 64, 32, 2, 4, (4, 4), 32)
    bad_zp = list(weights)
    bad_zp[2] = bad_zp[2].copy()
    bad_zp[2][3, 1, 0] = 17  # not an int4 code
    with pytest.raises(Exception, match="w13_zp.*above 15"):
        _run_onnxruntime(_model(64, (4, 4), bad_zp), feeds)
    short = list(weights)
    short[3] = short[3][:, :, :-1]  # w2 codes one byte short per row
    with pytest.raises(Exception, match="w2_q"):
        _run_openvino(_model(64, (4, 4), short), feeds)
    with pytest.raises(Exception, match=r"w13_bits.*4 \(int4\), 8 \(int8\) or 43"):
        _run_openvino(_model(64, (5, 4), weights), feeds)


def test_openvino_scans_int4_zero_points_before_any_inference(rng):
    """OpenVINO: a bad int4 zero point is refused when the model is read or compiled (never in the
    middle of a step), and the node keeps the scan's result across its re-validations: the plugin
    validates our nodes again on every inference, and a good model in the same process, read
    between bad ones (addresses get reused), must run and match every time."""
    from mla_export import ov_core

    core = ov_core()
    weights, feeds, expect = _case(rng, 8, 64, 32, 2, 4, (4, 4), 32)
    bad = list(weights)
    bad[2] = bad[2].copy()
    bad[2][5, 3, 0] = 16
    for _ in range(3):
        with pytest.raises(Exception, match="w13_zp.*above 15"):
            core.compile_model(core.read_model(_model(64, (4, 4), bad).SerializeToString()), "CPU",
                               {"INFERENCE_PRECISION_HINT": "f32"})
        compiled = core.compile_model(core.read_model(_model(64, (4, 4), weights).SerializeToString()), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2})
        for _ in range(3):
            got = compiled(feeds)[0]
            assert np.abs(got - expect).max() / np.abs(expect).max() < TOL


def test_onnxruntime_scans_constant_int4_zero_points_when_the_session_is_made(rng):
    """onnxruntime: int4 zero points given as initializers are scanned once, when the session is
    made (a bad one fails its creation, naming the input), not on every call; good ones run and
    match on every call."""
    import onnxruntime as ort

    from mla_export import ort_ops_path

    lib = ort_ops_path()
    if lib is None:
        pytest.skip("the onnxruntime custom-op library was not built (no onnxruntime headers)")
    weights, feeds, expect = _case(rng, 8, 64, 32, 2, 4, (4, 4), 32)
    bad = list(weights)
    bad[5] = bad[5].copy()
    bad[5][2, 7, 0] = 200
    so = ort.SessionOptions()
    so.register_custom_ops_library(lib)
    with pytest.raises(Exception, match="w2_zp.*above 15"):
        ort.InferenceSession(_model(64, (4, 4), bad).SerializeToString(), so, providers=["CPUExecutionProvider"])
    sess = ort.InferenceSession(_model(64, (4, 4), weights).SerializeToString(), so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        got = sess.run(None, feeds)[0]
        assert np.abs(got - expect).max() / np.abs(expect).max() < TOL


def _cpu_has(flag: str) -> bool:
    return cpu_has(flag)


def int8_activations_here() -> bool:
    """Whether the integer-weight ops run int8 activations under compute="bf16" with the table in
    use (kernel_paths.int8_activations)."""
    return int8_activations()


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_reduced_precision_compute(rng, runtime):
    """compute="bf16" (what the runtime sets under a bf16 hint): on AVX2 and VNNI CPUs the activations are
    quantised to int8 per block of inputs (as the plugin's dynamic quantisation and llama.cpp's Q8
    activations do) and the result is the reference's on those activations, for experts with few
    tokens (decode) and many (prefill: 60 tokens over 4 experts) alike, and ~12 an expert (24 tokens:
    on AMX-INT8 CPUs one short token tile of scattered rows); elsewhere it stays f32-exact."""
    weights, feeds, want, (w13, w2) = _case_full(rng, 4, 128, 64, 2, 60, (8, 4), 32)
    for n in (3, 24, 60):
        part = {k: v[:n] for k, v in feeds.items()}
        got = RUNTIMES[runtime](_model(128, (8, 4), weights, compute="bf16"), part)
        scale = np.abs(want[:n]).max()
        err_f32 = np.abs(got - want[:n]).max() / scale
        if int8_activations_here():
            want_q8 = ref.moe_experts(part["x"], part["ids"], part["wts"], w13, w2, q8_groups=(128, 32))
            # the down projection's int8 activations are quantised from f32 gate/up results, which
            # differ from the float64 reference's in the last bits (and between the VNNI dots and
            # the AMX tiles, whose f32 folds run in another order): now and then one rounds to the
            # neighbouring code (one step of its block's scale, ~1e-3 of that token's whole output
            # row); every other token matches
            dev = np.abs(got - want_q8).max(axis=1) / scale
            off = int((dev > 1e-4).sum())
            assert off <= max(1, n // 20) and dev.max() < 5e-3, (n, off, dev.max())
            assert err_f32 > 1e-6, f"int8 activations expected on this CPU, but the result is f32-exact ({err_f32:.1e})"
        else:
            assert err_f32 < TOL, n


def test_runtime_sets_compute_from_its_precision(tmp_path):
    """The OpenVINO executor tells each MlaMoeExperts node the precision it compiles for."""
    import openvino as ov

    from mla_export.runtime.executor_openvino import match_moe_compute

    weights, _, _ = _case(np.random.default_rng(0), 4, 64, 32, 2, 2, (8, 8), None)
    (tmp_path / "m.onnx").write_bytes(_model(64, (8, 8), weights).SerializeToString())
    from mla_export import ov_core

    model = ov_core().read_model(str(tmp_path / "m.onnx"))
    for precision, want in (("bf16", "bf16"), ("f32", "f32")):
        match_moe_compute(model, precision)
        ops = [op for op in model.get_ops() if op.get_type_name() == "MlaMoeExperts"]
        assert len(ops) == 1 and ops[0].get_attributes()["compute"] == want
