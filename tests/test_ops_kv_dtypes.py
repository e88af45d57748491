"""The f16, int8, fp8 and e5m2 latent caches (mla_export/formats/kv_formats.py, custom_ops/kernels/cache_formats.hpp)
through both runtimes' ops, against the float64 reference that stores the very same bytes.

Precision: every query, weight and output here is f32 (exactness); the only rounding under test
is the cache's own, which the reference reproduces bit for bit (the write) and then reads in
float64 (the attention), so the tolerance is the f32 one. Caches have shuffled block tables and
NaN in every row no sequence owns (quantised formats: a NaN scale)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from op_fronts import available_fronts, front
from mla_export.formats import kv_formats as kf
from mla_export.ops import reference as ref
from paged_problems import make_problem, randn, rel_err

NEW = ["f16", "int8", "fp8", "e5m2"]
TOL = 2e-5  # f32 accumulation against float64 on identical stored values


ov_ops = front("openvino")


def _runtimes():
    return [pytest.param(ops, id=name) for name, ops in available_fronts()]


RUNTIMES = _runtimes()


@pytest.mark.parametrize("ops", RUNTIMES)
@pytest.mark.parametrize("kv", NEW)
@pytest.mark.parametrize("src", ["f32", "bf16", "f16"])
def test_cache_write_is_bit_exact(rng, ops, kv, src):
    nb, bs, r, dr = 5, 16, 512, 64
    cache = kf.allocate(kv, nb, bs, r, dr, fill=0x7f)  # f16 0x7f7f, codes 0x7f: garbage everywhere
    before = cache.copy()
    t = 9
    kv_c, k_pe = randn(rng, (t, r), src, scale=3.0), randn(rng, (t, dr), src, scale=40.0)
    kv_c[2] = 0  # an all-zero row: scale 0, codes 0
    slots = rng.choice(nb * bs, size=t, replace=False).astype(np.int32)
    slots[-1] = -1
    ops.cache_write(kv_c, k_pe, cache, slots, kv_dtype=kv)
    expected = ref.cache_write(kv_c, k_pe, before.copy(), slots, kv_dtype=kv)
    np.testing.assert_array_equal(cache.view(np.uint8), expected.view(np.uint8))
    assert kf.row_bytes(kv, r, dr) == {"f16": 1152, "int8": 656, "fp8": 644, "e5m2": 644}[kv]
    rows = kf.decode_rows(cache.reshape(nb * bs, -1)[slots[:-1]], kv, r)
    err = np.abs(rows[:, :r] - kv_c[:-1].astype(np.float64)).max() / np.abs(kv_c.astype(np.float64)).max()
    assert err <= {"f16": 2 ** -11, "int8": 0.5 / 127, "fp8": 2 ** -4, "e5m2": 2 ** -3}[kv] * 1.01, err


# (values at scale 1, what they round to): int8 round half to even; fp8 on 3 mantissa bits and e5m2
# on 2, subnormal ties too (2^-10 and 2^-17 are ties to 0).
TIES = {
    "int8": ([0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 3.4999, 3.5], [0, 2, 2, -0.0, -2, 126, 3, 4]),
    "fp8": ([1.0625, 1.1875, -1.0625, 1.5 * 2 ** -9, 2.5 * 2 ** -9, 2 ** -10, 447.0, 15.5],
            [1.0, 1.25, -1.0, 2 * 2 ** -9, 2 * 2 ** -9, 0, 448, 16]),
    "e5m2": ([1.125, 1.375, -1.125, 1.5 * 2 ** -16, 2.5 * 2 ** -16, 2 ** -17, 57000.0, 15.0],
             [1.0, 1.5, -1.0, 2 * 2 ** -16, 2 * 2 ** -16, 0, 57344, 16]),
}


@pytest.mark.parametrize("ops", RUNTIMES)
@pytest.mark.parametrize("kv", ["int8", "fp8", "e5m2"])
def test_rounding_ties_zero_and_non_finite_rows(ops, kv):
    r, dr = 16, 2
    groups = kf.scale_groups(kv, r)  # int8: 4 groups of 4 values, fp8 / e5m2: one scale per row
    gs = r // groups
    top = kf.FORMATS[kv].top  # amax = top in every group: scales exactly 1, x / scale = x
    ties, rounded = TIES[kv]
    row = np.zeros(r, np.float32)
    row[::gs] = top
    at = [i for i in range(r) if i % gs][:len(ties)]  # the positions that are not a group's top
    row[at] = ties
    kv_c = np.stack([row, np.zeros(r, np.float32), row, row]).astype(np.float32)
    kv_c[2, at[4]] = np.nan
    kv_c[3, at[5]] = np.inf
    k_pe = np.ones((4, dr), np.float32)
    cache = kf.allocate(kv, 1, 4, r, dr)
    ops.cache_write(kv_c, k_pe, cache, np.arange(4, dtype=np.int32), kv_dtype=kv)
    expected = ref.cache_write(kv_c, k_pe, kf.allocate(kv, 1, 4, r, dr), np.arange(4), kv_dtype=kv)
    np.testing.assert_array_equal(cache, expected)
    got = kf.decode_rows(cache[0], kv, r)
    np.testing.assert_array_equal(got[0, at], rounded)
    assert np.all(got[1, :r] == 0)  # zero row: scales 0
    for t, bad in ((2, at[4]), (3, at[5])):  # non-finite: its group's scale is NaN (loud), the others hold
        g = bad // gs
        assert np.isnan(got[t, g * gs:(g + 1) * gs]).all()
        np.testing.assert_array_equal(np.delete(got[t, :r], np.arange(g * gs, (g + 1) * gs)),
                                      np.delete(got[0, :r], np.arange(g * gs, (g + 1) * gs)))
    assert np.all(got[2:, r:] == 1)  # k_pe unaffected


@pytest.mark.parametrize("ops", RUNTIMES)
def test_every_e4m3_code_reads_exactly(ops):
    """A one-token sequence's decode output is its row's latent values: all 254 finite codes."""
    codes = np.arange(256, dtype=np.uint8)
    codes[[0x7f, 0xff]] = 0  # the NaN codes are never written
    _decode_reads_codes_exactly(ops, "fp8", codes, ml_dtypes.float8_e4m3fn)


@pytest.mark.parametrize("ops", RUNTIMES)
def test_every_e5m2_code_reads_exactly(ops):
    """The same for e5m2: all 248 finite codes (0x7c..0x7f and 0xfc..0xff are inf / NaN, never written)."""
    codes = np.arange(256, dtype=np.uint8)
    codes[(codes & 0x7f) >= 0x7c] = 0
    _decode_reads_codes_exactly(ops, "e5m2", codes, ml_dtypes.float8_e5m2)


def _decode_reads_codes_exactly(ops, kv_dtype: str, codes: np.ndarray, code_dtype) -> None:
    """One cache row of the 256 codes with row scale 0.75 and a zero k_pe, read by a one-token
    decode whose output is exactly the row's latent values."""
    r, dr = 256, 8
    scale = np.float32(0.75)
    row = np.concatenate([codes, np.frombuffer(scale.tobytes(), np.uint8),
                          np.zeros(dr, ml_dtypes.bfloat16).view(np.uint8)])
    cache = np.ascontiguousarray(row[None, None, :])
    q = np.zeros((1, 1, r + dr), np.float32)
    out = ops.paged_decode(q, cache, np.zeros((1, 1), np.int32), np.ones(1, np.int32), 1.0, kv_lora_rank=r,
                           kv_dtype=kv_dtype)
    expected = codes.view(code_dtype).astype(np.float64) * 0.75
    np.testing.assert_array_equal(out[0, 0].astype(np.float64), expected)


@pytest.mark.parametrize("ops", RUNTIMES)
@pytest.mark.parametrize("kv", NEW)
@pytest.mark.parametrize("lens,r,dr,h,bs", [([1, 300, 33, 129], 512, 64, 16, 16), ([2500, 7], 20, 6, 3, 32)])
def test_decode(rng, ops, kv, lens, r, dr, h, bs):
    p = make_problem(rng, lens, np.ones(len(lens), int), r + dr, bs, kv, r=r)
    q = randn(rng, (len(lens), h, r + dr))
    scale = (r + dr) ** -0.5
    out = ops.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, scale, kv_lora_rank=r, kv_dtype=kv)
    expected = ref.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, scale, kv_lora_rank=r, kv_dtype=kv)
    assert not np.isnan(out).any(), "read a NaN-poisoned row no sequence owns"
    assert rel_err(out, expected) <= TOL


@pytest.mark.parametrize("ops", RUNTIMES)
@pytest.mark.parametrize("kv", NEW)
@pytest.mark.parametrize("form", ["absorbed", "expanded", "auto"])
def test_attention_mixed_batch(rng, ops, kv, form):
    h, dn, dr, r, dv = 4, 24, 16, 64, 20
    lens, qlens = [70, 9, 600, 1], [70, 2, 530, 1]  # prefill, extend, long chunked prefill, decode
    p = make_problem(rng, lens, qlens, r + dr, 16, kv, r=r)
    t = int(sum(qlens))
    q_nope, q_pe = randn(rng, (t, h, dn)), randn(rng, (t, h, dr))
    w_uk, w_uv = randn(rng, (h, dn, r), scale=0.2), randn(rng, (h, r, dv), scale=0.2)
    args = (q_nope, q_pe, p.kv_cache, w_uk, w_uv, p.query_start_loc, p.seq_lens, p.block_tables, 0.1)
    out = ops.paged_attention(*args, form=form, kv_dtype=kv)
    expected = ref.paged_attention_absorbed(*args, kv_dtype=kv)
    assert not np.isnan(out).any(), "read a NaN-poisoned row no sequence owns"
    assert rel_err(out, expected) <= TOL
    if form == "expanded":
        assert rel_err(ref.paged_attention_expanded(*args, kv_dtype=kv), expected) < 1e-12


@pytest.mark.parametrize("ops", RUNTIMES)
def test_format_errors_name_the_input(rng, ops):
    r, dr = 32, 8
    q = randn(rng, (1, 2, r + dr))
    bt, lens = np.zeros((1, 1), np.int32), np.ones(1, np.int32)
    bad_width = np.zeros((1, 4, kf.row_bytes("int8", r, dr) + 1), np.uint8)  # odd k_pe bytes
    with pytest.raises(Exception, match=r"kv_cache.*r \+ 4 \* G \+ 2 \* dr bytes.*G = 4"):
        ops.paged_decode(q, bad_width, bt, lens, 1.0, kv_lora_rank=r, kv_dtype="int8")
    with pytest.raises(Exception, match=r"multiple of 4"):  # int8's 4 groups need r % 4 == 0
        ops.paged_decode(randn(rng, (1, 2, 30 + dr)), np.zeros((1, 4, 30 + 16 + 2 * dr), np.uint8), bt, lens, 1.0,
                         kv_lora_rank=30, kv_dtype="int8")
    with pytest.raises(Exception, match=r"kv_dtype"):
        ops.paged_decode(q, np.zeros((1, 4, r + dr), np.float32).view(np.uint8), bt, lens, 1.0, kv_lora_rank=r,
                         kv_dtype="int4")
