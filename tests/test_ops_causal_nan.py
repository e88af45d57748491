"""Rows a token must not see are never read into its sum: NaN/Inf in a cache row past a token's
causal limit (a later new token's row) leaves that token's output exact.

Before the fix the probabilities of invisible rows were 0, but 0 x NaN = NaN in the weighted
sum. Both forms, both runtimes (OpenVINO and the onnxruntime library), f32 against the float64
reference."""

import numpy as np
import pytest

from op_fronts import available_fronts
from mla_export.ops import reference as ref
from paged_problems import make_problem, randn, rel_err

SMALL = dict(h=3, dn=24, dr=16, r=32, dv=20)


def _fronts():
    return available_fronts()


@pytest.mark.parametrize("front", [name for name, _ in _fronts()])
@pytest.mark.parametrize("form", ["absorbed", "expanded"])
@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_rows_past_the_causal_limit_are_not_read(rng, front, form, poison):
    mod = dict(_fronts())[front]
    h, dn, dr, r, dv = SMALL["h"], SMALL["dn"], SMALL["dr"], SMALL["r"], SMALL["dv"]
    # Sequence 0: 70 cached + 30 new (limits cross a 64-position chunk), sequence 1: 9 new.
    seq_lens, qlens, bs = [100, 9], [30, 9], 8
    p = make_problem(rng, seq_lens, qlens, r + dr, bs, "f32")
    t = int(sum(qlens))
    q_nope, q_pe = randn(rng, (t, h, dn)), randn(rng, (t, h, dr))
    w_uk, w_uv = randn(rng, (h, dn, r), scale=dn ** -0.5), randn(rng, (h, r, dv), scale=r ** -0.5)
    scale = (dn + dr) ** -0.5
    clean = p.kv_cache.copy()
    # The rows of the last new token of each sequence (position seq_len - 1) hold poison: only
    # that token may see them.
    for b, length in enumerate(seq_lens):
        pos = length - 1
        p.kv_cache[p.block_tables[b, pos // bs], pos % bs] = poison
    args = (q_nope, q_pe, p.kv_cache, w_uk, w_uv, p.query_start_loc, p.seq_lens, p.block_tables, scale)
    out = mod.paged_attention(*args, form=form)
    expected = ref.paged_attention_expanded(q_nope, q_pe, clean, w_uk, w_uv, p.query_start_loc, p.seq_lens,
                                            p.block_tables, scale)
    last = p.query_start_loc[1:] - 1
    others = np.setdiff1d(np.arange(t), last)
    assert np.isfinite(out[others]).all(), f"{front} {form}: a row past a token's causal limit reached its output"
    err = rel_err(out[others], expected[others])
    assert err <= 2e-5, f"{front} {form}: relative error {err:.3g}"
