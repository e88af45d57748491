"""Every bad input gives a clear error naming the input and the bad value; nothing crashes,
nothing is written before validation passes."""

import numpy as np
import pytest

from mla_export.ops import kernels
from paged_problems import make_problem, randn

R, DR, DN, DV, H = 32, 16, 8, 8, 2


@pytest.fixture
def problem(rng):
    p = make_problem(rng, [5, 20], [2, 20], R + DR, 8)
    t = int(p.qlens.sum())
    return dict(
        q_nope=randn(rng, (t, H, DN)), q_pe=randn(rng, (t, H, DR)), kv_cache=np.nan_to_num(p.kv_cache),
        w_uk=randn(rng, (H, DN, R)), w_uv=randn(rng, (H, R, DV)), query_start_loc=p.query_start_loc,
        seq_lens=p.seq_lens, block_tables=p.block_tables, scale=0.1)


def attention(**kw):
    return kernels.paged_attention(**kw)


def expect(fn, *patterns):
    with pytest.raises(Exception) as info:
        fn()
    msg = str(info.value)
    for p in patterns:
        assert p in msg, f"{p!r} not in error message: {msg}"


def test_valid_problem_runs(problem):
    assert attention(**problem).shape == (22, H, DV)


@pytest.mark.parametrize("key,value,patterns", [
    ("block_tables", lambda p: np.where(p["block_tables"] >= 0, p["block_tables"] + 1000, -1), ["'block_tables'", "block id 10", "outside [0,"]),
    ("seq_lens", lambda p: p["seq_lens"] + np.array([0, 100], np.int32), ["'seq_lens'", "120"]),
    ("query_start_loc", lambda p: np.array([0, 7, 22], np.int32), ["'query_start_loc'", "7 new tokens", "seq_lens 5"]),
    ("query_start_loc", lambda p: np.array([0, 2, 21], np.int32), ["'query_start_loc'", "must end at T = 22"]),
    ("query_start_loc", lambda p: np.array([1, 2, 22], np.int32), ["'query_start_loc'", "start at 0"]),
    ("q_pe", lambda p: p["q_pe"][:, :, :-1], ["'q_pe'", "dimension 2"]),
    ("w_uk", lambda p: p["w_uk"][:1], ["'w_uk'", "dimension 0"]),
    ("w_uv", lambda p: p["w_uv"][:, 1:], ["'w_uv'", "dimension 1"]),
    ("q_nope", lambda p: p["q_nope"][0], ["'q_nope'", "rank 3"]),
    ("kv_cache", lambda p: p["kv_cache"][0], ["'kv_cache'", "rank 3"]),
    ("seq_lens", lambda p: p["seq_lens"][:1], ["'seq_lens'", "batch size"]),
    ("block_tables", lambda p: p["block_tables"].astype(np.float32), ["'block_tables'", "int32 or int64"]),
    ("q_nope", lambda p: p["q_nope"].astype(np.float64), ["'q_nope'", "float32, float16 or bfloat16"]),
])
def test_attention_rejects(problem, key, value, patterns):
    problem[key] = value(problem)
    expect(lambda: attention(**problem), *patterns)


def test_seq_len_over_table_capacity(problem):
    problem["block_tables"] = problem["block_tables"][:, :2]  # capacity 16 < 20
    expect(lambda: attention(**problem), "'seq_lens'", "outside [0, 16]")


def test_decode_rejects(rng):
    """The decode form of MlaPagedAttention (kernels.paged_decode): a sequence without the new
    token's position, a q row narrower than the cache's, a rank at the row width, a bad block."""
    p = make_problem(rng, [5, 9], [1, 1], R + DR, 4)
    q = randn(rng, (2, H, R + DR))
    expect(lambda: kernels.paged_decode(q, p.kv_cache, p.block_tables, np.array([5, 0], np.int32), 0.1, R),
           "'query_start_loc'", "1 new tokens, more than its seq_lens 0")
    expect(lambda: kernels.paged_decode(q[:, :, :-1], p.kv_cache, p.block_tables, p.seq_lens, 0.1, R), "'q_pe'",
           "row width")
    expect(lambda: kernels.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, 0.1, R + DR), "kv_lora_rank")
    bad = p.block_tables.copy()
    bad[1, 2] = -7
    expect(lambda: kernels.paged_decode(q, p.kv_cache, bad, p.seq_lens, 0.1, R), "'block_tables'", "-7", "[1, 2]")


def test_cache_write_rejects_and_writes_nothing(rng):
    cache = randn(rng, (3, 4, R + DR))
    before = cache.copy()
    kv_c, k_pe = randn(rng, (3, R)), randn(rng, (3, DR))
    for slots, patterns in [
        ([0, 12, 1], ["'slot_mapping'", "slot 12", "outside [0, 12)"]),
        ([5, 2, 5], ["'slot_mapping'", "slot 5 twice"]),
    ]:
        expect(lambda: kernels.cache_write(kv_c, k_pe, cache, np.array(slots, np.int32)), *patterns)
        np.testing.assert_array_equal(cache, before)
    expect(lambda: kernels.cache_write(kv_c, k_pe[:, 1:], cache, np.arange(3, dtype=np.int32)), "'kv_cache'", "row width")
    expect(lambda: kernels.cache_write(kv_c, k_pe[:2], cache, np.arange(3, dtype=np.int32)), "'k_pe'", "dimension 0")
    expect(lambda: kernels.cache_write(kv_c, k_pe, cache, np.arange(2, dtype=np.int32)), "'slot_mapping'", "dimension 0")
    expect(lambda: kernels.cache_write(kv_c, k_pe, cache.astype(np.int32), np.arange(3, dtype=np.int32)), "'kv_cache'")
    expect(lambda: kernels.cache_write(kv_c, k_pe, cache, np.array([0, 1, 2**40])), "'slot_mapping'", "int32 range")
    np.testing.assert_array_equal(cache, before)


def test_attention_form_attribute_is_checked(problem):
    expect(lambda: kernels.paged_attention(**problem, form="fast"), "form must be one of")
