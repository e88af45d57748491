"""The paged latent cache's bookkeeping: a ref-counted block pool, prefix caching, copy-on-write.

Pure bookkeeping (vLLM's kv_cache_manager / block_pool split): block ids, reference counts and
prefix hashes, no cache memory. The cache arrays belong to the backend (backend.py,
cache_layout.py); when a block must be copied the manager only records (source, destination),
`Scheduler.schedule()` hands the copies out in `SchedulerOutput.blocks_to_copy`, and the
backend applies them before the step's graph runs (nothing writes the cache in between).

Blocks (vLLM v1's design, simplified to one KV cache group):
- a block is referenced by every request whose block table holds it (ref count);
- a *full* block of computed tokens gets a hash chained over its parent's hash and its token
  ids, so equal hashes mean equal whole prefixes, and is registered in the prefix cache;
- a block whose count drops to 0 goes back to the free queue but, if registered, keeps its
  contents and registration until it is handed out again (least recently freed first). A later
  request with the same prefix takes it back from the free queue and skips that prefill;
- a block that is shared (count > 1) or registered is immutable: a request that must write into
  it (a fully cached prompt recomputes its last token for the logits) gets a private copy first
  (see backend.py for why copy-on-write stays rather than recomputing the last block).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Sequence

import numpy as np

__all__ = ["BlockPool", "KVCacheManager", "block_hash"]


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """Chained hash of a full block: sha256(parent hash | token ids as int64). A 256-bit digest,
    not Python's hash(): a collision would silently attend to another prompt's cache."""
    return hashlib.sha256(parent + np.asarray(token_ids, dtype=np.int64).tobytes()).digest()


class BlockPool:
    """Ref-counted block ids, the free queue (evict front, free to back) and the prefix cache map."""

    def __init__(self, num_blocks: int, order_seed: int | None = None):
        order = np.arange(num_blocks)
        if order_seed is not None:  # tests: block tables far from contiguous
            order = np.random.default_rng(order_seed).permutation(num_blocks)
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(order.tolist())
        self._refs = [0] * num_blocks
        self._hash_of = [None] * num_blocks  # block -> its registered hash
        self._block_of: dict[bytes, int] = {}  # hash -> block

    @property
    def num_free(self) -> int:
        """Blocks with no reference (cached ones included: they can be evicted)."""
        return len(self._free)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} blocks, {len(self._free)} free")  # callers check first
        blocks = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def touch(self, block: int) -> None:
        """Take one more reference (a prefix-cache hit); an unreferenced block leaves the free queue."""
        if self._refs[block] == 0:
            del self._free[block]
        self._refs[block] += 1

    def release(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
            elif self._refs[block] < 0:
                raise RuntimeError(f"block {block} released more often than referenced")

    def lookup(self, h: bytes) -> int | None:
        return self._block_of.get(h)

    def register(self, block: int, h: bytes) -> None:
        # A second block with the same contents (two requests computed the same prefix at the
        # same time) stays unregistered: the first one serves later hits.
        if h not in self._block_of and self._hash_of[block] is None:
            self._block_of[h] = block
            self._hash_of[block] = h

    def unregister(self, block: int) -> None:
        """Drop a block's prefix-cache entry (its contents are about to change)."""
        self._evict(block)

    def is_immutable(self, block: int) -> bool:
        return self._refs[block] > 1 or self._hash_of[block] is not None

    def _evict(self, block: int) -> None:
        h = self._hash_of[block]
        if h is not None:
            del self._block_of[h]
            self._hash_of[block] = None


class KVCacheManager:
    """Every request's block table over a pool of `num_blocks` block ids."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        block_order_seed: int | None = None,
        draft_rows: bool = False,
    ):
        """draft_rows: the blocks also hold MTP draft rows (runtime/mtp_propose.py), whose row at a
        position depends on the token after it; a prefix hit then stops one token short of its
        last block, so that position runs again and its draft row is this request's."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the cache needs at least one block of at least one row")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.draft_rows = draft_rows
        self.pool = BlockPool(num_blocks, order_seed=block_order_seed)
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[bytes]] = {}  # chained hashes of a request's full token blocks
        self._num_registered: dict[str, int] = {}  # how many leading blocks are in the prefix cache
        self.num_copied_blocks = 0  # copy-on-write count
        self._block_copies: list[tuple[int, int]] = []  # (source, destination) not yet handed out

    def take_block_copies(self) -> list[tuple[int, int]]:
        """The block copies decided since the last call, in order; the caller applies them to
        the cache memory before any row of the step is written."""
        copies, self._block_copies = self._block_copies, []
        return copies

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def block_table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def get_computed_blocks(self, request_id: str, token_ids: Sequence[int]) -> tuple[list[int], int]:
        """The longest cached prefix of `token_ids` in whole blocks: (its blocks, tokens it covers).

        At least the last token is left to compute, since its logits are needed; when the whole
        prompt is cached its last block is still returned and will be copied before the write.
        Nothing is referenced yet (`allocate_slots` does that), so a failed admission can retry.
        """
        if not self.enable_prefix_caching:
            return [], 0
        blocks = []
        for h in self._full_block_hashes(request_id, token_ids):
            block = self.pool.lookup(h)
            if block is None:
                break
            blocks.append(block)
        hit = len(blocks) * self.block_size - (1 if self.draft_rows and blocks else 0)
        return blocks, min(hit, len(token_ids) - 1)

    def allocate_slots(
        self, request_id: str, num_computed: int, num_new: int, computed_blocks: Sequence[int] = ()
    ) -> bool:
        """Make room for tokens [num_computed, num_computed + num_new) of a request.

        `computed_blocks` (from `get_computed_blocks`, only when the request has no table yet) are
        referenced and prepended. Blocks about to be written that are shared or cached get a
        private copy. Returns False, changing nothing, when there are not enough free blocks.
        """
        bs = self.block_size
        table = self._tables.get(request_id, [])
        if computed_blocks and table:
            raise ValueError("cached prefix blocks can only start a request's block table")
        candidate = table + list(computed_blocks)
        first_written, last_written = num_computed // bs, (num_computed + num_new - 1) // bs
        num_alloc = max(0, last_written + 1 - len(candidate))
        # Cached blocks taken back from the free queue no longer count as free.
        reused_free = sum(1 for b in computed_blocks if self.pool.ref_count(b) == 0)
        # Computed blocks are registered, hence immutable: writing into one always copies it.
        to_copy = [
            i for i in range(first_written, min(last_written + 1, len(candidate))) if self.pool.is_immutable(candidate[i])
        ]
        if num_alloc + len(to_copy) > self.pool.num_free - reused_free:
            # A cached block no other request holds can be taken over instead of copied: its
            # registration is dropped and it is written in place. Only when the copy does not
            # fit: a fully cached prompt on an exactly full cache needs every block it has, and
            # the copy would need one more than admission counted.
            own = [i for i in to_copy if i >= len(table) and self.pool.ref_count(candidate[i]) == 0]
            if num_alloc + len(to_copy) - len(own) > self.pool.num_free - reused_free:
                return False
            for i in own:
                self.pool.unregister(candidate[i])
            to_copy = [i for i in to_copy if i not in own]

        for block in computed_blocks:
            self.pool.touch(block)
        if request_id not in self._tables:
            self._tables[request_id] = table
            self._num_registered[request_id] = len(computed_blocks)  # they came from the cache
        table.extend(computed_blocks)
        for i in to_copy:
            self._copy_on_write(table, i)
        table.extend(self.pool.allocate(num_alloc))
        return True

    def cache_full_blocks(self, request_id: str, token_ids: Sequence[int], num_computed: int) -> None:
        """Register the request's newly completed full blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        done = self._num_registered[request_id]
        full = num_computed // self.block_size
        if full <= done:
            return
        hashes = self._full_block_hashes(request_id, token_ids)
        table = self._tables[request_id]
        for i in range(done, full):
            self.pool.register(table[i], hashes[i])
        self._num_registered[request_id] = full

    def free_tail(self, request_id: str, num_tokens: int) -> None:
        """Return the blocks past the first ceil(num_tokens / block_size) of a request's table
        (blocks that held only rejected speculative rows). They were never registered: only full
        blocks of committed tokens are."""
        table = self._tables.get(request_id)
        if table is None:
            return
        keep = -(-num_tokens // self.block_size)
        if len(table) > keep:
            self.pool.release(table[keep:][::-1])
            del table[keep:]

    def free(self, request_id: str) -> None:
        """Drop every reference a request holds (finished, aborted or preempted)."""
        table = self._tables.pop(request_id, [])
        # Tail blocks first: they are the least likely to be shared, so they are evicted first.
        self.pool.release(table[::-1])
        self._hashes.pop(request_id, None)
        self._num_registered.pop(request_id, None)

    def _copy_on_write(self, table: list[int], index: int) -> None:
        old = table[index]
        (new,) = self.pool.allocate(1)
        self._block_copies.append((old, new))  # `old` keeps its rows until the copy is applied
        table[index] = new
        self.pool.release([old])
        self.num_copied_blocks += 1

    def _full_block_hashes(self, request_id: str, token_ids: Sequence[int]) -> list[bytes]:
        """Hashes of every full block of `token_ids`, extended incrementally per request."""
        hashes = self._hashes.setdefault(request_id, [])
        bs = self.block_size
        for i in range(len(hashes), len(token_ids) // bs):
            hashes.append(block_hash(hashes[-1] if hashes else b"", token_ids[i * bs : (i + 1) * bs]))
        return hashes
