"""MlaMoeExperts on codes in 16-row tiles (layout = "tile16": both projections' int8 or int4 codes
rewritten by the runtime on VNNI CPUs without AMX; custom_ops/kernels/moe_experts.cpp, runtime/qlinear_tiles.py).

The op on tile16 experts against the float64 reference in both runtimes, f32 and compute="bf16",
1-2 tokens an expert (decode: the gate and up tiles read side by side), a few and many (prefill):
f32 compute is exact (every kernel of the 4-row layout rewrites a tile back first); under bf16 the
result is the reference's on int8 activations where this CPU's table runs them (the tile16 VNNI
dots on VNNI CPUs), as the exported layout's is. fp8 experts in tiles at f32 take the rewrite-back
path (their bf16 dots: tests/test_fp8_weights_op.py::test_moe_fp8_bf16_dots).
"""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.export.quantize import FP8_BITS, fp8_dequantize, fp8_operands
from mla_export.ops import reference as ref
from mla_export.runtime.qlinear_tiles import to_tile16
from test_moe_experts_op import RUNTIMES, TOL, _case_full, int8_activations_here
from test_moe_experts_op import _model as moe_model

E, H, I, K = 6, 128, 64, 2  # experts, hidden, intermediate (whole 16-row tiles), experts per token


def _model(weights, bits=(8, 8), compute="f32", layout="tile16"):
    return moe_model(H, bits, weights, compute=compute, layout=layout)


def _tile16_weights(weights):
    """Both projections' operands with each expert's matrices in 16-row tiles."""
    return [*to_tile16(*weights[:3]), *to_tile16(*weights[3:])]


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("bits", [(8, 8), (4, 4), (4, 8)], ids=lambda b: "w13int{}-w2int{}".format(*b))
@pytest.mark.parametrize("tokens", [1, 2, 5, 40, 300])
def test_tile16_experts_match_reference(rng, runtime, tokens, bits):
    """1-2 tokens: every routed expert runs the paired decode dots; 5: a few an expert; 40 and 300:
    many (the skewed routing of _case_full gives one expert most of them). int4 codes in groups of
    32, alone or beside int8 as a recipe's may be."""
    weights, feeds, want, (w13, w2) = _case_full(rng, E, H, I, K, tokens, bits, 32)
    groups = tuple(32 if b == 4 else None for b in bits)
    tiled = _tile16_weights(weights)
    scale = np.abs(want).max()
    got = RUNTIMES[runtime](_model(tiled, bits), feeds)
    assert np.abs(got - want).max() / scale < TOL, "f32 compute on tile16 codes"
    got = RUNTIMES[runtime](_model(tiled, bits, compute="bf16"), feeds)
    rows4 = RUNTIMES[runtime](_model(weights, bits, compute="bf16", layout="rows4"), feeds)
    if not int8_activations_here():
        assert np.abs(got - want).max() / scale < TOL and np.array_equal(got, rows4)
        return
    # int8 activations: the reference's on them, as the exported layout's (the down projection's
    # int8 rows are quantised from f32 gate/up results whose last bits depend on the f32 folds'
    # order: now and then one rounds to the neighbouring code, ~1e-3 of that token's row)
    want_q8 = ref.moe_experts(feeds["x"], feeds["ids"], feeds["wts"], w13, w2,
                              q8_groups=(groups[0] or H, groups[1] or I))
    for name, out in (("tile16", got), ("rows4", rows4)):
        dev = np.abs(out - want_q8).max(axis=1) / scale
        off = int((dev > 1e-4).sum())
        assert off <= max(1, tokens // 20) and dev.max() < 5e-3, (name, tokens, off, dev.max())
    assert np.abs(got - want).max() / scale > 1e-6, "int8 activations expected on this CPU"


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_fp8_experts_in_tiles_rewrite_back(rng, runtime):
    """fp8 codes may lie in tiles too (their weight-format entry); the experts' kernels of the 4-row
    layout rewrite each tile back: f32-exact against the reference on the decoded weights."""
    w13 = (rng.standard_normal((E, 2 * I, H)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((E, H, I)) * 0.1).astype(np.float32)
    ops13, ops2 = fp8_operands(w13, 32), fp8_operands(w2, 32)
    weights = _tile16_weights(list(ops13) + list(ops2))
    x = rng.standard_normal((9, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(9)]).astype(np.int64)
    wts = rng.random((9, K)).astype(np.float32)
    want = ref.moe_experts(x, ids, wts, fp8_dequantize(ops13[0], ops13[1]), fp8_dequantize(ops2[0], ops2[1]))
    got = RUNTIMES[runtime](_model(weights, bits=(FP8_BITS, FP8_BITS)), {"x": x, "ids": ids, "wts": wts})
    assert np.abs(got - want).max() / np.abs(want).max() < TOL
