"""MlaCacheWrite against the reference: in place, padding skipped, other rows untouched."""

import numpy as np
import pytest

from mla_export.ops import kernels
from mla_export.ops import reference as ref
from paged_problems import randn


@pytest.mark.parametrize("cache_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("src_dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_eight_tokens_last_is_padding(rng, cache_dtype, src_dtype, index_dtype):
    nb, bs, r, dr = 6, 16, 512, 64
    cache = randn(rng, (nb, bs, r + dr), cache_dtype)
    before = cache.copy()
    kv_c, k_pe = randn(rng, (8, r), src_dtype), randn(rng, (8, dr), src_dtype)
    slots = rng.choice(nb * bs, size=8, replace=False).astype(index_dtype)
    slots[-1] = -1
    out = kernels.cache_write(kv_c, k_pe, cache, slots)
    assert out is cache
    expected = ref.cache_write(kv_c, k_pe, before.copy(), slots)
    np.testing.assert_array_equal(cache.view(np.uint8), expected.view(np.uint8))  # bit-exact
    # The padding token's row would have been `slots[-1]`: nothing anywhere else changed.
    changed = np.any(cache.reshape(nb * bs, -1).astype(np.float32) != before.reshape(nb * bs, -1).astype(np.float32), axis=1)
    assert set(np.flatnonzero(changed)) <= set(slots[:-1].tolist())


@pytest.mark.parametrize("block_size", [1, 16, 32, 64, 128])
def test_block_sizes_and_odd_widths(rng, block_size):
    r, dr = 20, 6
    nb = 5
    cache = randn(rng, (nb, block_size, r + dr))
    t = min(nb * block_size, 37)
    slots = rng.permutation(nb * block_size)[:t].astype(np.int32)
    slots[rng.random(t) < 0.2] = -1
    kv_c, k_pe = randn(rng, (t, r)), randn(rng, (t, dr))
    expected = ref.cache_write(kv_c, k_pe, cache.copy(), slots)
    kernels.cache_write(kv_c, k_pe, cache, slots)
    np.testing.assert_array_equal(cache, expected)


def test_non_contiguous_inputs_and_cache(rng):
    r, dr = 16, 8
    big = randn(rng, (4, 8, 2 * (r + dr)))
    cache = big[:, :, ::2]  # a strided view: updated through a copy written back
    kv_c = randn(rng, (5, 2 * r))[:, ::2]
    k_pe = np.asfortranarray(randn(rng, (5, dr)))
    slots = np.array([3, 31, -1, 0, 17], dtype=np.int32)
    expected = ref.cache_write(kv_c, k_pe, np.array(cache), slots)
    kernels.cache_write(kv_c, k_pe, cache, slots)
    np.testing.assert_array_equal(cache, expected)
    np.testing.assert_array_equal(big[:, :, ::2], expected)


def test_empty_batch_writes_nothing(rng):
    cache = randn(rng, (2, 4, 10))
    before = cache.copy()
    kernels.cache_write(np.zeros((0, 8), np.float32), np.zeros((0, 2), np.float32), cache, np.zeros(0, np.int32))
    np.testing.assert_array_equal(cache, before)
