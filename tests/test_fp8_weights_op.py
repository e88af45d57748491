"""fp8 (e4m3) weight codes in MlaQLinear and MlaMoeExperts (`bits` = 43, custom_ops/kernels/qgemm.hpp).

f32 exactness against the float64 reference (mla_export.ops.reference) on the weights the codes
decode to (fp8_dequantize): few rows of x (dot products on the codes) and many (dequantised
panels), mixed fp8 / int8 projections in the MoE op, both runtimes, and every vector table this
CPU runs (tests/test_ops_isa.py switches them in process). compute="bf16" (the
runtime's reduced precision) on AVX512_BF16 CPUs runs fewer than 16 rows as bf16 dots, and from 8
rows AMX-BF16 tiles where the CPU has them: exact against the reference on bf16-rounded
activations with the subnormal codes as 0. Every finite
e4m3 code, subnormals and -0 included, decodes to its exact value (f32).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mla_export.ops import kernel_config
from mla_export.ops import reference as ref
from mla_export.export.quantize import FP8_BITS, fp8_dequantize, fp8_operands, interleave_rows4
from mla_export.runtime.qlinear_tiles import to_tile16
from test_moe_experts_op import RUNTIMES, TOL, _model as moe_model
from test_qlinear_op import _model as qlinear_model


BF16_DOT_ROWS = 16  # below this many rows, compute="bf16" runs fp8 codes on bf16 rows (qmatmul.hpp)


def _fp8(rng, shape, group):
    w = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    codes, scales, zp = fp8_operands(w, group)
    return [codes, scales, zp], fp8_dequantize(codes, scales)


def _bf16_dots() -> bool:
    """Whether compute="bf16" takes the fp8 codes' bf16 dots here (AVX512_BF16 and the AVX-512 table)."""
    from test_moe_experts_op import _cpu_has

    return kernel_config.config().isa == "avx512" and _cpu_has("avx512_bf16")


def _bf16_path(rows: int) -> bool:
    """Whether compute="bf16" runs `rows` rows of x on bf16 activations here: bf16 dots below 16
    rows, at every row count when the codes are widened by VBMI lookups (fp8_codes=lut), AMX-BF16
    tiles from 8 (where the CPU and OS have them), else f32 panels."""
    amx = _bf16_dots() and kernel_config.config().amx
    lut = _bf16_dots() and kernel_config.config().fp8_codes == "lut"
    return ((rows < BF16_DOT_ROWS or lut) and _bf16_dots()) or (rows >= 8 and amx)


def _bf16_reference(x, weights):
    """What the bf16 dots compute: activations rounded to bf16, subnormal codes as 0, f32 sums."""
    codes, scales, _ = weights
    normal = np.where(codes & 0x78, codes, codes & 0x80).astype(np.uint8)  # exponent 0 -> (signed) zero
    return ref.linear(x.astype(ml_dtypes.bfloat16).astype(np.float32), fp8_dequantize(normal, scales))


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("compute", [None, "bf16"])
@pytest.mark.parametrize("n,k,group,rows", [(32, 128, 128, 1), (64, 256, 128, 3), (96, 96, 32, 9), (64, 128, 64, 300)])
def test_qlinear_fp8_matches_reference(rng, runtime, compute, n, k, group, rows):
    """f32: exact on the codes' values. compute="bf16" below 16 rows on AVX512_BF16 CPUs: exact on
    bf16-rounded activations (and the subnormal codes as 0), which differs from the f32 result."""
    weights, w = _fp8(rng, (n, k), group)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    got = RUNTIMES[runtime](qlinear_model(k, n, weights, FP8_BITS, compute=compute), {"x": x})
    want = ref.linear(x, w)
    if compute == "bf16" and _bf16_path(rows):
        assert np.abs(got - want).max() / np.abs(want).max() > 1e-6, "bf16 products expected, the result is f32-exact"
        want = _bf16_reference(x, weights)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < TOL, f"{runtime} N{n} K{k} g{group} M{rows}: max rel error {err:.2e}"


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_every_e4m3_code_decodes_exactly(runtime):
    """A weight row per code position holding all 254 finite codes (NaNs 0x7F / 0xFF left out),
    scales 2^-3, x one-hot: each output is exactly code x scale (float16's route, subnormals too)."""
    finite = np.array([c for c in range(256) if c & 0x7F != 0x7F] + [0, 0], np.uint8)  # 254 + 2 zeros = 256
    codes = np.stack([np.roll(finite, 32 * r) for r in range(32)])  # [32, 256]
    scales = np.full((32, 2), 0.125, np.float32)
    x = np.eye(256, dtype=np.float32)[:5]  # inputs 0..4
    model = qlinear_model(256, 32, [interleave_rows4(codes), scales, np.zeros((32, 2), np.uint8)], FP8_BITS)
    got = RUNTIMES[runtime](model, {"x": x})
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * 0.125
    np.testing.assert_array_equal(got, values[:, :5].T)
    x_all = np.eye(256, dtype=np.float32)[100:110]
    np.testing.assert_array_equal(RUNTIMES[runtime](model, {"x": x_all}), values[:, 100:110].T)


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("bits,tokens", [((FP8_BITS, FP8_BITS), 1), ((FP8_BITS, FP8_BITS), 40), ((FP8_BITS, 8), 5),
                                         ((8, FP8_BITS), 23)])
def test_moe_fp8_matches_reference(rng, runtime, bits, tokens):
    from mla_export.export.quantize import dequantize, moe_operands, quantize

    experts, hidden, inter, k = 6, 128, 64, 2
    ops, deq = [], []
    for b, shape in zip(bits, [(experts, 2 * inter, hidden), (experts, hidden, inter)]):
        if b == FP8_BITS:
            w, d = _fp8(rng, shape, 32)
        else:
            q = quantize((rng.standard_normal(shape) * 0.1).astype(np.float32), 8)
            w, d = list(moe_operands(q)), dequantize(q)
        ops += w
        deq.append(d)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]).astype(np.int64)
    if tokens >= 20:
        ids[:, 0] = 3  # one expert with many tokens: its panels
    wts = rng.random((tokens, k)).astype(np.float32)
    got = RUNTIMES[runtime](moe_model(hidden, bits, ops), {"x": x, "ids": ids, "wts": wts})
    want = ref.moe_experts(x, ids, wts, *deq)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < TOL, f"{runtime} {bits} T{tokens}: max rel error {err:.2e}"


@pytest.mark.parametrize("layout", ["rows4", "tile16"])
@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("tokens", [1, 3, 40], ids=["decode", "dots", "one-expert-40-tokens"])
def test_moe_fp8_bf16_dots(rng, runtime, tokens, layout):
    """compute="bf16": both projections' fp8 codes on bf16 rows (AVX512_BF16 CPUs; an expert with
    40 tokens on AMX-BF16 tiles where the CPU has them), against the same math in numpy:
    bf16-rounded x and silu(gate) * up, subnormal codes 0. tile16: the experts' codes in 16-row
    tiles (the runtime's rewrite on AVX512-BF16 + VBMI CPUs without AMX), on the tile16 bf16 dots
    where they run (fp8_codes=lut), else each tile read back in the 4-row layout."""
    experts, hidden, inter, k = 6, 128, 64, 2
    if tokens >= BF16_DOT_ROWS and _bf16_dots() and not _bf16_path(tokens):
        pytest.skip("40 tokens of one expert run f32 panels here (no AMX-BF16) while the others run bf16 dots")
    (w13_ops, _), (w2_ops, _) = _fp8(rng, (experts, 2 * inter, hidden), 32), _fp8(rng, (experts, hidden, inter), 32)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    ids = np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]).astype(np.int64)
    if tokens >= 16:
        ids[:, 0], ids[:, 1] = 3, np.where(ids[:, 1] == 3, 4, ids[:, 1])  # expert 3: every token
    wts = rng.random((tokens, k)).astype(np.float32)
    weights = list(w13_ops) + list(w2_ops)
    if layout == "tile16":
        weights = [*to_tile16(*weights[:3]), *to_tile16(*weights[3:])]  # each expert's matrices in 16-row tiles
    got = RUNTIMES[runtime](moe_model(hidden, (FP8_BITS, FP8_BITS), weights, compute="bf16", layout=layout),
                           {"x": x, "ids": ids, "wts": wts})
    if not _bf16_dots():
        want = ref.moe_experts(x, ids, wts, fp8_dequantize(*w13_ops[:2]), fp8_dequantize(*w2_ops[:2]))
    else:
        def flushed(ops):
            codes, scales, _ = ops
            return fp8_dequantize(np.where(codes & 0x78, codes, codes & 0x80).astype(np.uint8), scales).astype(np.float64)

        bf = lambda a: np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)  # noqa: E731
        w13, w2 = flushed(w13_ops), flushed(w2_ops)
        want = np.zeros((tokens, hidden))
        for t in range(tokens):
            for j in np.argsort(ids[t]):  # ascending expert order, as the op adds them
                e = ids[t, j]
                gu = w13[e] @ bf(x[t])
                act = gu[:inter] / (1 + np.exp(-gu[:inter])) * gu[inter:]
                want[t] += wts[t, j] * (w2[e] @ bf(act))
    # the op's f32 silu(gate) * up may round to the other bf16 neighbour than float64's (a tie within
    # ~1e-7): one such flip moves an output by ~2^-8 of one term, hence the looser bound
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 3e-3, f"{runtime}: max rel error {err:.2e}"
