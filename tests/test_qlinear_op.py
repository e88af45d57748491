"""MlaQLinear, x @ W^T on int8/int4 codes (custom_ops/kernels/qlinear.hpp), in both runtimes.

Exactness (f32 compute) against the float64 reference (mla_export.ops.reference.linear) on the
weights the codes decode to: int8 and int4 with several group sizes, few rows of x (dot products
on the codes) and many (dequantised panels), rank-3 x, bf16/f16 activations. The reduced-precision
mode (compute="bf16", what the runtime sets under a bf16 hint) against the reference on int8
activations (every row count, AVX2 and AVX-512 VNNI CPUs; f32-exact elsewhere). Then the boundary: bad
shapes, types, zero points and attributes fail naming the input.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mla_export.ops import reference as ref
from mla_export.export.quantize import dequantize, moe_operands, quantize
from mla_export.runtime.qlinear_tiles import to_tile16
from test_moe_experts_op import RUNTIMES, TOL, int8_activations_here

NAMES = ["w_q", "w_s", "w_zp"]


def _model(k: int, n: int, weights, bits: int, rank: int = 2, x_type=TensorProto.FLOAT, compute: str | None = None,
           layout: str | None = None):
    inits = [numpy_helper.from_array(np.ascontiguousarray(a), name) for a, name in zip(weights, NAMES)]
    extra = {} if compute is None else {"compute": compute}
    if layout is not None:
        extra["layout"] = layout
    node = helper.make_node("MlaQLinear", ["x"] + NAMES, ["y"], domain="mla_export", bits=bits, **extra)
    lead = [None] * (rank - 1)
    graph = helper.make_graph([node], "qlinear", [helper.make_tensor_value_info("x", x_type, lead + [k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, lead + [n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mla_export", 1)])


def _case(rng, n, k, bits, group):
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    qw = quantize(w, bits, group if bits == 4 else None)
    return list(moe_operands(qw)), dequantize(qw)


SHAPES = [  # N, K, bits, int4 group, rows of x
    (32, 64, 8, None, 1),
    (64, 96, 4, 32, 3),
    (96, 128, 4, 64, 5),
    (128, 256, 8, None, 9),
    (64, 128, 4, 128, 20),
    (320, 64, 4, 32, 7),
    (64, 128, 4, 32, 300),  # many rows: two row blocks of the work split (256 + 44)
    (96, 64, 8, None, 513),
]


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N{}-K{}-int{}-g{}-M{}".format(*s))
def test_matches_reference(rng, runtime, shape):
    n, k, bits, group, m = shape
    weights, w = _case(rng, n, k, bits, group)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = RUNTIMES[runtime](_model(k, n, weights, bits), {"x": x})
    want = ref.linear(x, w)
    assert got.shape == want.shape
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < TOL, f"{runtime} {shape}: max rel error {err:.2e}"


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_rank3_and_half_activations(rng, runtime):
    weights, w = _case(rng, 64, 96, 4, 32)
    x = rng.standard_normal((2, 3, 96)).astype(np.float32)
    got = RUNTIMES[runtime](_model(96, 64, weights, 4, rank=3), {"x": x})
    assert got.shape == (2, 3, 64)
    want = ref.linear(x, w)
    assert np.abs(got - want).max() / np.abs(want).max() < TOL
    x16 = x.astype(np.float16)  # widened by the op: exact on the f16 values
    got16 = RUNTIMES[runtime](_model(96, 64, weights, 4, rank=3, x_type=TensorProto.FLOAT16), {"x": x16})
    want16 = ref.linear(x16.astype(np.float32), w)
    assert np.abs(got16 - want16).max() / np.abs(want16).max() < TOL


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("rows,bits,group", [(1, 8, 256), (2, 4, 64), (3, 8, 256), (8, 8, 256), (11, 8, 256),
                                             (5, 4, 32), (16, 4, 64), (64, 4, 64), (300, 4, 64), (64, 8, 256),
                                             (20, 4, 128), (48, 8, 256), (40, 4, 32)])
def test_reduced_precision_compute(rng, runtime, rows, bits, group):
    """Activation blocks of 64, 128 (int8 per channel: one group of 256) and 32 inputs. On AVX2/VNNI CPUs
    MlaQLinear runs every row count on int8 activations (qmatmul.hpp): 4 weight rows a call for 1-2
    rows of x, 8 from 3 rows on, in calls of up to 4 rows of x; 300 rows also cross the f32 path's
    row blocks; from 16 rows with 64- or 128-input blocks, AMX-INT8 tiles where the CPU has them
    (full, partial and odd counts of 16-row tiles). Elsewhere it stays f32-exact."""
    weights, w = _case(rng, 128, 256, bits, group)
    x = rng.standard_normal((rows, 256)).astype(np.float32)
    got = RUNTIMES[runtime](_model(256, 128, weights, bits, compute="bf16"), {"x": x})
    want = ref.linear(x, w)
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    if int8_activations_here():  # int8 activations, exactly the reference's on them, in every row
        row_err = np.abs(got - ref.linear(x, w, q8_group=group)).max(axis=1) / scale
        assert row_err.max() < 1e-4, (row_err.argmax(), row_err.max())
        assert err > 1e-6, f"int8 activations expected on this CPU, but the result is f32-exact ({err:.1e})"
    else:
        assert err < TOL


def _bad_cases():
    def zp_above_15(x, wts):
        wts[2] = wts[2].copy()
        wts[2][5, 0] = 16
    def short_codes(x, wts):
        wts[0] = wts[0][:, :-1]
    def three_groups(x, wts):  # 64 inputs do not split into 3 groups of a multiple of 32
        wts[1] = np.ones((wts[1].shape[0], 3), np.float32)
        wts[2] = np.zeros((wts[2].shape[0], 3), np.uint8)
    def rows_not_32(x, wts):
        wts[0], wts[1], wts[2] = wts[0][:36], wts[1][:36], wts[2][:36]
    return [("w_zp", zp_above_15, "w_zp.*above 15"), ("w_q", short_codes, "w_q"),
            ("w_s", three_groups, "w_s.*group count"), ("w_q rows", rows_not_32, "w_q.*divisible by 32")]


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("bad", _bad_cases(), ids=lambda b: b[0])
def test_bad_inputs_name_the_input(rng, runtime, bad):
    _, spoil, pattern = bad
    weights, _ = _case(rng, 64, 64, 4, 32)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    spoil(x, weights)
    with pytest.raises(Exception, match=pattern):
        RUNTIMES[runtime](_model(64, weights[0].shape[0], weights, 4), {"x": x})


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_bad_attribute_and_x(rng, runtime):
    weights, _ = _case(rng, 64, 64, 8, None)
    with pytest.raises(Exception, match=r"bits.*4 \(int4\), 8 \(int8\) or 43"):
        RUNTIMES[runtime](_model(64, 64, weights, 5), {"x": np.zeros((1, 64), np.float32)})
    with pytest.raises(Exception, match="w_q|x"):  # x's K does not match the codes
        RUNTIMES[runtime](_model(32, 64, weights, 8), {"x": np.zeros((1, 32), np.float32)})


@pytest.mark.parametrize("layout", ["rows4", "tile16"])
@pytest.mark.parametrize("rows, group", [(70, None), (8, None), (13, None), (20, None), (11, 64), (16, 128)])
def test_amx_int8_tiles_give_the_vnni_sums(rng, rows, group, layout):
    """On CPUs with AMX-INT8 products of 8 rows and more run on tiles (qmatmul_amx.cpp), elsewhere
    on the vector dots: both sum the same int32 products, so the two (amx=0 against the default,
    switched in process) agree with the reference on int8 activations; on an AMX CPU
    they must differ in the last bits (the f32 folds run in another order: the tiles ran). Rows:
    70 (prefill: two full token tiles, then a 6-row one), 8, 11, 13 and 16 (one token tile:
    decode), 20 (a full and a 4-row one). int8 weights per channel (group None) and in groups of
    128 and 64 inputs (activation blocks of 128 and 64: 2 and 1 tile steps a fold). Codes in the
    exported 4-row layout (re-laid into tiles per call) and in the tile16 one (loaded as B tiles where
    they lie; the vector side runs the tile16 dots)."""
    from kernel_paths import running
    from test_moe_experts_op import _run_openvino

    if not int8_activations_here():
        pytest.skip("no int8 activations on this CPU")
    wf = (rng.standard_normal((96, 256)) * 0.1).astype(np.float32)
    qw = quantize(wf, 8, group)
    weights, w = list(moe_operands(qw)), dequantize(qw)
    if layout == "tile16":
        weights = list(to_tile16(*weights))
    x = rng.standard_normal((rows, 256)).astype(np.float32)
    model = _model(256, 96, weights, 8, compute="bf16", layout=layout)
    outs, tiles = {}, False
    for amx in ("0", "auto"):
        with running(f"amx={amx}") as config:
            outs[amx] = _run_openvino(model, {"x": x})
            tiles = tiles or config.amx
    want = ref.linear(x, w, q8_group=group or 256)
    scale = np.abs(want).max()
    for amx, got in outs.items():
        assert np.abs(got - want).max() / scale < 1e-4, amx
    if tiles:
        assert not np.array_equal(outs["0"], outs["auto"]), "AMX-INT8 CPU, but the tiles did not run"
    else:
        np.testing.assert_array_equal(outs["0"], outs["auto"])
