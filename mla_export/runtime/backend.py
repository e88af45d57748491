"""`OpenVINOMLABackend`: the attention backend class a model server sees.

Shaped like vLLM's attention backends (`vllm/attention/backends/abstract.py`): static facts
about the cache layout, block moves across the per-layer caches, and the classes that do the
work: the metadata builder (`MLAMetadataBuilder`: per-sequence facts -> graph inputs) and the
implementation (`OpenVINOMLAExecutor`: the compiled graph that writes and reads the cache).

The cache is the MLA latent cache: one [num_blocks, block_size, W] array per layer, one shared
"KV head" whose row is [kv_c (r) | k_pe (dr)], W = r + dr (576 for DeepSeek).
"""

from __future__ import annotations

import importlib
from typing import Sequence

import numpy as np

from .metadata import MLAMetadata, MLAMetadataBuilder

__all__ = ["OpenVINOMLABackend", "RUNTIMES"]

DEEPSEEK_ROW_WIDTH = 576  # kv_lora_rank 512 + qk_rope_head_dim 64

# runtime -> (module, executor class); every executor takes (contract, kv_caches, *, precision,
# num_threads), writes the caches in place (or says why not) and has execute(metadata) -> logits.
_IMPLS = {
    "openvino": ("executor_openvino", "OpenVINOMLAExecutor"),
    "onnxruntime": ("executor_onnxruntime", "OnnxRuntimeMLAExecutor"),
}
RUNTIMES = tuple(_IMPLS)


class OpenVINOMLABackend:
    @staticmethod
    def get_name() -> str:
        return "OPENVINO_MLA"

    @staticmethod
    def get_supported_head_sizes(row_width: int | None = None) -> list[int]:
        """The cache row width the graph was exported for: 576 for DeepSeek, or the contract's
        `cache.row_width` for other dims (the kernels take any r and dr)."""
        return [DEEPSEEK_ROW_WIDTH if row_width is None else int(row_width)]

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, int, int]:
        # MLA caches one latent row per token shared by every head: there is no head axis.
        if num_kv_heads != 1:
            raise ValueError(f"the MLA latent cache has exactly one KV head, got num_kv_heads={num_kv_heads}")
        if min(num_blocks, block_size, head_size) < 1:
            raise ValueError("num_blocks, block_size and head_size must be positive")
        return (int(num_blocks), int(block_size), int(head_size))

    @staticmethod
    def get_metadata_cls() -> type[MLAMetadata]:
        return MLAMetadata

    @staticmethod
    def get_builder_cls() -> type[MLAMetadataBuilder]:
        return MLAMetadataBuilder

    @staticmethod
    def get_impl_cls(runtime: str = "openvino"):
        """The executor class running the exported graph: OpenVINO (the IR, or the ONNX graph
        with the MLA ops) or onnxruntime. Imported on demand, so only the chosen runtime loads."""
        if runtime not in _IMPLS:
            raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
        module, name = _IMPLS[runtime]
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)

    @staticmethod
    def swap_blocks(src_cache: np.ndarray, dst_cache: np.ndarray, src_to_dst) -> None:
        """dst_cache[d] = src_cache[s] for each row (s, d) of the [N, 2] mapping (one layer;
        the two caches may have different block counts, e.g. a device cache and a swap space)."""
        pairs = _block_pairs(src_to_dst)
        if src_cache.shape[1:] != dst_cache.shape[1:] or src_cache.dtype != dst_cache.dtype:
            raise ValueError(
                f"swap_blocks needs caches of the same block shape and dtype, got "
                f"{src_cache.shape}/{src_cache.dtype} and {dst_cache.shape}/{dst_cache.dtype}"
            )
        _check_ids(pairs[:, 0], src_cache.shape[0], "source")
        _check_ids(pairs[:, 1], dst_cache.shape[0], "destination")
        dst_cache[pairs[:, 1]] = src_cache[pairs[:, 0]]

    @staticmethod
    def copy_blocks(kv_caches: Sequence[np.ndarray], src_to_dsts) -> None:
        """Within each layer's cache, copy block s onto block d for each row (s, d) of the [N, 2]
        mapping. All sources are read before any destination is written (numpy evaluates the
        right-hand gather first), so a block can be both a source and a destination."""
        pairs = _block_pairs(src_to_dsts)
        for cache in kv_caches:
            _check_ids(pairs, cache.shape[0], "block")
            cache[pairs[:, 1]] = cache[pairs[:, 0]]


def _block_pairs(mapping) -> np.ndarray:
    pairs = np.asarray(mapping)
    if pairs.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or not np.issubdtype(pairs.dtype, np.integer):
        raise ValueError(f"a block mapping must be an [N, 2] integer array, got {pairs.shape} {pairs.dtype}")
    return pairs.astype(np.int64, copy=False)


def _check_ids(ids: np.ndarray, num_blocks: int, what: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= num_blocks):
        raise ValueError(f"{what} ids must lie in [0, {num_blocks}), got {ids.min()}..{ids.max()}")
