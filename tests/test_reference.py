"""The reference's two forms of paged MLA agree with each other and with decode."""

import numpy as np
import pytest

from mla_export.ops import reference as ref
from paged_problems import make_problem, randn


@pytest.mark.parametrize("prefix,new", [([0], [9]), ([64], [17]), ([0, 40, 128], [23, 5, 31]), ([7, 0, 300], [1, 1, 2])])
def test_absorbed_equals_expanded(rng, prefix, new):
    h, dn, dr, r, dv = 3, 16, 8, 32, 12
    p = make_problem(rng, np.add(prefix, new), new, r + dr, block_size=16)
    t = int(p.qlens.sum())
    q_nope, q_pe = randn(rng, (t, h, dn)), randn(rng, (t, h, dr))
    w_uk, w_uv = randn(rng, (h, dn, r), scale=0.2), randn(rng, (h, r, dv), scale=0.2)
    args = (q_nope, q_pe, p.kv_cache, w_uk, w_uv, p.query_start_loc, p.seq_lens, p.block_tables, 0.17)
    a = ref.paged_attention_absorbed(*args)
    e = ref.paged_attention_expanded(*args)
    assert not np.isnan(a).any()
    np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-10)


def test_decode_is_attention_with_one_new_token(rng):
    h, dn, dr, r, dv = 4, 8, 8, 16, 8
    p = make_problem(rng, [5, 33, 1], [1, 1, 1], r + dr, block_size=4)
    q_nope, q_pe = randn(rng, (3, h, dn)), randn(rng, (3, h, dr))
    w_uk, w_uv = randn(rng, (h, dn, r)), randn(rng, (h, r, dv))
    lat = ref.paged_decode(ref.absorb_query(q_nope, q_pe, w_uk), p.kv_cache, p.block_tables, p.seq_lens, 0.3,
                           kv_lora_rank=r)
    full = ref.paged_attention_expanded(q_nope, q_pe, p.kv_cache, w_uk, w_uv, p.query_start_loc, p.seq_lens,
                                        p.block_tables, 0.3)
    np.testing.assert_allclose(np.einsum("bhr,hrv->bhv", lat, w_uv.astype(np.float64)), full, rtol=1e-10, atol=1e-10)


def test_cache_write_skips_padding_and_leaves_other_rows(rng):
    cache = randn(rng, (4, 4, 6))
    before = cache.copy()
    kv_c, k_pe = randn(rng, (3, 4)), randn(rng, (3, 2))
    ref.cache_write(kv_c, k_pe, cache, [9, -1, 0])
    np.testing.assert_array_equal(cache[2, 1], np.concatenate([kv_c[0], k_pe[0]]))
    np.testing.assert_array_equal(cache[0, 0], np.concatenate([kv_c[2], k_pe[2]]))
    untouched = np.ones((4, 4), bool)
    untouched[2, 1] = untouched[0, 0] = False
    np.testing.assert_array_equal(cache[untouched], before[untouched])
