"""The block pool and KVCacheManager: ref counts, prefix caching, copy-on-write, no leaks.

The manager is bookkeeping only; these tests keep the cache memory themselves (like the
backend does) and apply the manager's block copies to it with the backend's copy_blocks."""

from __future__ import annotations

import numpy as np
import pytest

from mla_export.runtime.backend import copy_blocks
from mla_export.runtime.cache_layout import CacheLayout
from mla_export.runtime.kv_cache import KVCacheManager, block_hash


def _manager(num_blocks=8, bs=4, prefix=True, seed=None, layers=2):
    kv = KVCacheManager(num_blocks, bs, enable_prefix_caching=prefix, block_order_seed=seed)
    kv.test_caches = CacheLayout(layers, bs, 6, "f32").allocate(num_blocks)  # the memory, held by the test
    return kv


def _run(kv, rid, tokens, num_new=None, computed=0, blocks=()):
    """Allocate and 'compute' tokens: apply the block copies, fill the rows with the token id,
    then register blocks (the order of an engine step)."""
    num_new = len(tokens) - computed if num_new is None else num_new
    assert kv.allocate_slots(rid, computed, num_new, blocks)
    copy_blocks(kv.test_caches, kv.take_block_copies())
    table = kv.block_table(rid)
    for pos in range(computed, computed + num_new):
        for cache in kv.test_caches:
            cache[table[pos // kv.block_size], pos % kv.block_size] = tokens[pos]
    kv.cache_full_blocks(rid, tokens, computed + num_new)


def test_allocation_order_is_shuffled_by_seed_and_everything_is_freed():
    kv = _manager(num_blocks=16, seed=3)
    _run(kv, "a", list(range(30)))
    table = kv.block_table("a")
    assert len(table) == 8 and len(set(table)) == 8
    assert table != sorted(table)  # not contiguous
    assert kv.num_free_blocks == 8
    kv.free("a")
    assert kv.num_free_blocks == 16 and kv.block_table("a") == []
    assert [kv.pool.ref_count(b) for b in range(16)] == [0] * 16


def test_capacity_failure_changes_nothing():
    kv = _manager(num_blocks=3)
    _run(kv, "a", list(range(8)))  # 2 blocks
    assert not kv.allocate_slots("b", 0, 5)  # needs 2, 1 free
    assert kv.block_table("b") == [] and kv.num_free_blocks == 1
    assert kv.allocate_slots("a", 8, 4)  # a third block for a
    assert kv.num_free_blocks == 0


def test_chained_hashes_depend_on_the_whole_prefix():
    h1 = block_hash(b"", [1, 2, 3, 4])
    assert block_hash(b"", [1, 2, 3, 4]) == h1
    assert block_hash(h1, [5, 6, 7, 8]) != block_hash(block_hash(b"", [0, 2, 3, 4]), [5, 6, 7, 8])


def test_prefix_hit_shares_full_blocks_and_counts_references():
    kv = _manager(num_blocks=8)
    a = list(range(10))  # blocks [0..3], [4..7] full; [8, 9] partial
    _run(kv, "a", a)
    b = a[:8] + [50, 51, 52]
    blocks, n = kv.get_computed_blocks("b", b)
    assert blocks == kv.block_table("a")[:2] and n == 8
    _run(kv, "b", b, computed=n, blocks=blocks)
    assert kv.block_table("b")[:2] == kv.block_table("a")[:2]
    assert kv.block_table("b")[2] != kv.block_table("a")[2]
    assert [kv.pool.ref_count(x) for x in kv.block_table("a")] == [2, 2, 1]
    # Same second block but a different first one: the chain does not match.
    c = [99] + a[1:8] + [1]
    assert kv.get_computed_blocks("c", c) == ([], 0)
    kv.free("a")
    kv.free("b")
    assert kv.num_free_blocks == 8


def test_cached_free_blocks_are_reused_then_evicted_when_needed():
    kv = _manager(num_blocks=4)
    a = list(range(9))
    _run(kv, "a", a)
    kv.free("a")
    assert kv.num_free_blocks == 4  # cached blocks count as free
    blocks, n = kv.get_computed_blocks("b", a[:8] + [7])
    assert n == 8 and len(blocks) == 2
    # Fill the whole cache with another request: the cached blocks are evicted.
    _run(kv, "x", [200 + i for i in range(16)])
    kv.free("x")
    assert kv.get_computed_blocks("b", a[:8] + [7]) == ([], 0)


def test_fully_cached_prompt_recomputes_its_last_token_in_a_private_copy():
    kv = _manager(num_blocks=8)
    a = list(range(8))  # exactly two full blocks
    _run(kv, "a", a)
    shared_last = kv.block_table("a")[1]
    blocks, n = kv.get_computed_blocks("b", a)
    assert len(blocks) == 2 and n == 7  # the last token is left to compute (its logits)
    assert kv.allocate_slots("b", 7, 1, blocks)
    table_b = kv.block_table("b")
    assert table_b[0] == kv.block_table("a")[0] and table_b[1] != shared_last
    assert kv.num_copied_blocks == 1
    assert kv.take_block_copies() == [(shared_last, table_b[1])]  # handed out once, in order
    assert kv.take_block_copies() == []
    copy_blocks(kv.test_caches, [(shared_last, table_b[1])])
    for cache in kv.test_caches:  # the copy carries the 3 rows b does not recompute
        np.testing.assert_array_equal(cache[table_b[1], :3], cache[shared_last, :3])
    assert kv.pool.ref_count(shared_last) == 1  # only a holds it again
    kv.free("a")
    kv.free("b")
    assert kv.num_free_blocks == 8


def test_without_prefix_caching_nothing_is_shared():
    kv = _manager(prefix=False)
    _run(kv, "a", list(range(8)))
    assert kv.get_computed_blocks("b", list(range(8))) == ([], 0)


def test_budget_to_blocks():
    # 2 layers * 4 rows * 6 wide * 2 bytes (bf16) = 96 bytes a block
    assert CacheLayout(2, 4, 6, "bf16").blocks_for_memory(1000) == 10
    assert CacheLayout(2, 4, 6, "f16").blocks_for_memory(1000) == 10
    # fp8 rows of r = 4, dr = 2: 4 codes + 4 scale bytes + 2 bf16 = 12 bytes, 96 a block;
    # int8 rows hold 4 group scales: 4 + 16 + 4 = 24 bytes, 192 a block
    layout = CacheLayout(2, 4, 6, "fp8", kv_lora_rank=4)
    assert layout.blocks_for_memory(1000) == 10
    assert [a.shape for a in layout.allocate(3)] == [(3, 4, 12)] * 2 and layout.allocate(1)[0].dtype == np.uint8
    layout = CacheLayout(2, 4, 6, "int8", kv_lora_rank=4)
    assert layout.blocks_for_memory(1000) == 5
    assert [a.shape for a in layout.allocate(3)] == [(3, 4, 24)] * 2
    with pytest.raises(ValueError, match="needs kv_lora_rank"):
        CacheLayout(2, 4, 6, "fp8")
    with pytest.raises(ValueError, match="unsupported cache dtype"):
        CacheLayout(2, 4, 6, "int4")


@pytest.mark.parametrize("dtype, latent_row, index_row", [("f32", 24, 32), ("bf16", 12, 16), ("int8", 4 + 16 + 4, 8 + 16),
                                                           ("fp8", 4 + 4 + 4, 8 + 4), ("e5m2", 4 + 4 + 4, 8 + 4)])
def test_indexer_key_caches_share_the_blocks_and_count_in_the_memory(dtype, latent_row, index_row):
    """A sparse-attention model's indexer-key caches (8 values a row here: all of them codes for
    int8/fp8, no k_pe part) come after the latent ones, one array per indexer layer on the same
    block ids, and each block's bytes count both."""
    layout = CacheLayout(3, 4, 6, dtype, kv_lora_rank=4, index_layers=2, index_width=8)
    assert layout.names() == ["kv_cache.0", "kv_cache.1", "kv_cache.2", "index_cache.0", "index_cache.1"]
    arrays = layout.allocate(5)
    assert [a.shape[:2] for a in arrays] == [(5, 4)] * 5
    assert [a.nbytes // 20 for a in arrays] == [latent_row] * 3 + [index_row] * 2
    assert layout.block_bytes == 4 * (3 * latent_row + 2 * index_row)
    assert layout.blocks_for_memory(10 * layout.block_bytes) == 10
