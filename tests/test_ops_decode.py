"""Decode (MlaPagedAttention's decode form, kernels.paged_decode) against the float64 reference
(vLLM mla_decode_kvcache semantics)."""

import numpy as np
import pytest

from mla_export.ops import kernels
from mla_export.ops import reference as ref
from paged_problems import make_problem, randn, rel_err

# Relative error bounds (max |err| / max |expected|), by the output's dtype: f32 accumulates in
# f32 throughout; bf16/f16 outputs are rounded once at the end.
TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1e-2}


def run_case(rng, seq_lens, h, r, dr, bs, q_dtype="f32", cache_dtype="f32", scale=None):
    p = make_problem(rng, seq_lens, np.ones(len(seq_lens), int), r + dr, bs, cache_dtype)
    q = randn(rng, (len(seq_lens), h, r + dr), q_dtype)
    scale = (r + dr) ** -0.5 if scale is None else scale
    out = kernels.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, scale, kv_lora_rank=r)
    expected = ref.paged_decode(q, p.kv_cache, p.block_tables, p.seq_lens, scale, kv_lora_rank=r)
    assert out.shape == (len(seq_lens), h, r)
    assert out.dtype == q.dtype
    assert not np.isnan(out.astype(np.float32)).any(), "read a NaN-poisoned row no sequence owns"
    err = rel_err(out, expected)
    assert err <= TOL[q_dtype], f"relative error {err:.3g} > {TOL[q_dtype]}"


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_vllm_case_b4_h16_varlen(rng, dtype):
    lens = np.clip(rng.normal(256, 128, size=4).astype(int), 2, None)
    run_case(rng, lens, 16, 512, 64, 16, q_dtype=dtype, cache_dtype=dtype)


@pytest.mark.parametrize("lens", [[5], [1, 300, 33], [513, 1, 129, 7]])
@pytest.mark.parametrize("cache_dtype", ["f32", "bf16"])
def test_listed_lengths(rng, lens, cache_dtype):
    run_case(rng, lens, 16, 512, 64, 16, cache_dtype=cache_dtype)


@pytest.mark.parametrize("block_size", [1, 16, 32, 64, 128])
def test_block_sizes(rng, block_size):
    run_case(rng, [1, 70, block_size + 3, 2 * block_size], 4, 64, 16, block_size)


@pytest.mark.parametrize("h", [1, 3, 16, 128])
def test_head_counts(rng, h):
    run_case(rng, [17, 2], h, 512, 64, 16, cache_dtype="bf16")


def test_odd_dims_and_long_context_split_across_threads(rng):
    # One sequence of 3000 tokens: the context is split across threads and merged (LSE).
    run_case(rng, [3000], 5, 20, 6, 32)
    run_case(rng, [2500, 1], 2, 512, 64, 16)


def test_uneven_batch_split_into_balanced_parts(rng):
    # One long sequence among short ones: the plan cuts the long one into several parts that
    # the threads take dynamically, and merges them; the short ones stay whole.
    run_case(rng, [5000, 3, 900, 64], 16, 512, 64, 16, cache_dtype="bf16")


def test_large_scores_stay_finite(rng):
    # Scores of several hundred: the online softmax must subtract the running max.
    run_case(rng, [200, 31], 4, 64, 16, 16, scale=3.0)
