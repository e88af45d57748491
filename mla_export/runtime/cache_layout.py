"""The latent cache's memory layout: what one layer's array looks like and how many blocks fit
(with the indexer-key caches of a DeepSeek Sparse Attention model beside it).

One C-contiguous array per layer in the contract's cache format (mla_export/formats/kv_formats.py):
[num_blocks, block_size, W] of a float format's dtype, or u8 [num_blocks, block_size, row bytes]
for a quantised one. MLA caches one latent row per token shared by every head, so there is no head axis.
The executor binds these very arrays to the graph, so they are never replaced, only written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats import kv_formats

__all__ = ["CacheLayout", "cache_dtype", "get_kv_cache_shape"]


def cache_dtype(name: str) -> np.dtype:
    """numpy dtype of the cache arrays of a contract cache dtype name (u8 for quantised formats)."""
    if name not in kv_formats.KV_DTYPES:
        raise ValueError(f"unsupported cache dtype {name!r}: the cache must be one of {list(kv_formats.KV_DTYPES)}")
    return kv_formats.storage_dtype(name)


def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, int, int]:
    """vLLM's backend question, answered for MLA: one shared latent "KV head", no head axis."""
    if num_kv_heads != 1:
        raise ValueError(f"the MLA latent cache has exactly one KV head, got num_kv_heads={num_kv_heads}")
    if min(num_blocks, block_size, head_size) < 1:
        raise ValueError("num_blocks, block_size and head_size must be positive")
    return (int(num_blocks), int(block_size), int(head_size))


@dataclass(frozen=True)
class CacheLayout:
    num_layers: int
    block_size: int
    row_width: int  # W = kv_lora_rank + qk_rope_head_dim values
    dtype: str  # kv_formats.KV_DTYPES
    kv_lora_rank: int | None = None  # r: needed for quantised rows (codes | scale | k_pe)
    # DeepSeek Sparse Attention: one indexer-key cache per layer with its own indexer, rows of
    # index_width values in the same dtype (quantised formats: every value quantised, no k_pe part), on the
    # same block ids as the latent caches, so every block operation covers them too.
    index_layers: int = 0
    index_width: int = 0

    @classmethod
    def of(cls, contract) -> "CacheLayout":
        """The layout an export's graph contract (`mla_graph.json`) declares."""
        model, cache = contract.model, contract.cache
        index = cache.get("index") or {}
        return cls(model["num_layers"], cache["block_size"], cache["row_width"], cache["dtype"], model["kv_lora_rank"],
                   index.get("num_layers", 0), index.get("row_width", 0))

    def names(self) -> list[str]:
        """The graph inputs the arrays of `allocate()` bind to, in its order."""
        return ([f"kv_cache.{i}" for i in range(self.num_layers)] +
                [f"index_cache.{j}" for j in range(self.index_layers)])

    def __post_init__(self):
        cache_dtype(self.dtype)  # names the unsupported dtype
        if self.num_layers < 1:
            raise ValueError("the cache needs at least one layer")
        if self.dtype in kv_formats.QUANTISED and not (self.kv_lora_rank and 0 < self.kv_lora_rank < self.row_width):
            raise ValueError(f"an {self.dtype} cache needs kv_lora_rank in [1, {self.row_width - 1}], "
                             f"got {self.kv_lora_rank!r}")

    @property
    def row_bytes(self) -> int:
        if self.dtype in kv_formats.QUANTISED:
            return kv_formats.row_bytes(self.dtype, self.kv_lora_rank, self.row_width - self.kv_lora_rank)
        return self.row_width * cache_dtype(self.dtype).itemsize

    @property
    def index_row_bytes(self) -> int:
        if not self.index_layers:
            return 0
        if self.dtype in kv_formats.QUANTISED:
            return kv_formats.row_bytes(self.dtype, self.index_width, 0)
        return self.index_width * cache_dtype(self.dtype).itemsize

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across every layer (latent and indexer-key caches)."""
        return self.block_size * (self.num_layers * self.row_bytes + self.index_layers * self.index_row_bytes)

    def blocks_for_memory(self, budget_bytes: int) -> int:
        return int(budget_bytes) // self.block_bytes

    def shape(self, num_blocks: int) -> tuple[int, int, int]:
        # Quantised arrays are u8 rows of bytes: the last axis counts bytes, not values.
        width = self.row_bytes if self.dtype in kv_formats.QUANTISED else self.row_width
        return get_kv_cache_shape(num_blocks, self.block_size, 1, width)

    def allocate(self, num_blocks: int) -> list[np.ndarray]:
        """One zeroed array per layer, then one per indexer layer (names() gives their inputs)."""
        shape = self.shape(num_blocks)
        arrays = [np.zeros(shape, dtype=cache_dtype(self.dtype)) for _ in range(self.num_layers)]
        if self.index_layers:
            quantised = self.dtype in kv_formats.QUANTISED
            width = self.index_row_bytes if quantised else self.index_width
            index_shape = get_kv_cache_shape(num_blocks, self.block_size, 1, width)
            arrays += [np.zeros(index_shape, dtype=cache_dtype(self.dtype)) for _ in range(self.index_layers)]
        return arrays
