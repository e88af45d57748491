"""`MLABackend`: the one object the engine talks to about the cache and the graph.

Shaped like vLLM's attention backend plus its model runner's cache ownership:
  - cache layout: `CacheLayout` (cache_layout.py) sizes and allocates one array per layer; the
    backend owns those arrays (the memory), the KVCacheManager only hands out block ids;
  - metadata -> graph inputs: `MLAMetadataBuilder` (metadata.py), writing each step straight
    into the executor's own input arrays (`executor.metadata_tensors`);
  - execute: one executor per runtime behind it (executor_openvino.py, executor_onnxruntime.py),
    constructed on the backend's arrays and writing them in place;
  - block operations: the copies the KVCacheManager decided in `Scheduler.schedule()`
    (SchedulerOutput.blocks_to_copy), applied here before the step's graph runs.

Why block operations rather than vLLM's "a full prompt hit recomputes its last block": that rule
would recompute up to block_size tokens where copy-on-write copies one block and computes one
token; it changes the prefill work (and the bf16 numerics of those rows) of every fully cached
prompt. Returning the copies keeps the scheduler's decisions and every result exactly as they
were, and still leaves the manager pure bookkeeping.
"""

from __future__ import annotations

import importlib
from typing import Sequence

import numpy as np

from . import batch_invariance
from ..formats.contract import Contract
from .cache_layout import CacheLayout, get_kv_cache_shape
from .metadata import MLAMetadata, MLAMetadataBuilder

__all__ = ["MLABackend", "RUNTIMES", "executor_class", "copy_blocks", "get_kv_cache_shape"]

# runtime -> (module, executor class); every executor takes (contract, kv_caches, *, precision,
# num_threads), writes the caches in place (or says why not) and has execute(metadata) -> logits
# and describe().
_IMPLS = {
    "openvino": ("executor_openvino", "OpenVINOMLAExecutor"),
    "onnxruntime": ("executor_onnxruntime", "OnnxRuntimeMLAExecutor"),
}
RUNTIMES = tuple(_IMPLS)


def executor_class(runtime: str):
    """The executor class of a runtime, imported on demand so only the chosen runtime loads."""
    if runtime not in _IMPLS:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    module, name = _IMPLS[runtime]
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


class MLABackend:
    """The caches of an exported model, its metadata builder and the executor of one runtime."""

    def __init__(self, contract: Contract, num_blocks: int, *, runtime: str = "openvino", precision: str = "bf16",
                 num_threads: int | None = None, batch_invariant: bool = False, mtp_draft: bool = False,
                 decode_graph_batches: Sequence[int] = (), decode_graphs_required: bool = False,
                 verify_tokens: int = 0, max_model_len: int | None = None):
        """batch_invariant: each sequence's logits the same whatever else is in the step and however its
        prompt was cut into chunks (batch_invariance.py says what that pins and what it refuses).
        mtp_draft: also compile the export's MTP draft graph (mtp_draft.py) on a latent cache of its
        own, shaped as a main layer's (and, for a sparse-attention model, an indexer-key cache shaped
        as a main indexer layer's): its rows sit at the main cache's slots, so every block id the
        KVCacheManager hands out serves both and block copies are applied to it too.
        decode_graph_batches (OpenVINO): the batch sizes whose decode steps run on graphs compiled
        with static shapes (decode_graphs.py), block tables padded to max_model_len's blocks; unless
        decode_graphs_required, left out where each would copy the plugin's MatMul weights;
        verify_tokens (1 + drafts a sequence): their speculative verify steps too."""
        if not isinstance(batch_invariant, bool):
            raise ValueError(f"batch_invariant must be True or False, got {batch_invariant!r}")
        if batch_invariant and (why := batch_invariance.problem(contract, precision, runtime)):
            raise ValueError(f"batch_invariant: {why}")
        model, cache = contract.model, contract.cache
        self.layout = CacheLayout.of(contract)
        impl = executor_class(runtime)  # the runtime name is checked before any memory is taken
        self.kv_caches = self.layout.allocate(num_blocks)
        self.builder = MLAMetadataBuilder(cache["block_size"], num_blocks, model["max_position_embeddings"],
                                          model["vocab_size"])
        self.batch_invariant = batch_invariant
        static = {}
        if decode_graph_batches:
            if runtime != "openvino":
                raise ValueError(f"decode_graph_batches: static decode graphs are OpenVINO's; {runtime} runs every "
                                 f"step without per-node shape inference already (pass none)")
            if batch_invariant:
                raise ValueError("decode_graph_batches: batch-invariant mode runs every step on one graph (pass none)")
            static = {"decode_graph_batches": tuple(decode_graph_batches), "max_model_len": max_model_len,
                      "decode_graphs_required": decode_graphs_required, "verify_tokens": verify_tokens}
        self.executor = impl(contract, self.kv_caches, precision=precision, num_threads=num_threads,
                             batch_invariant=batch_invariant, **static)
        self.draft, self.draft_cache, self.draft_caches = None, None, []
        if mtp_draft:
            from .mtp_draft import MTPDraftRunner

            # kv_cache.<N> as a main layer's; index_cache.<N> as a main indexer layer's (sparse attention)
            like = [self.kv_caches[0]] + ([self.kv_caches[self.layout.num_layers]] if self.layout.index_layers else [])
            self.draft_caches = [np.zeros_like(c) for c in like]
            self.draft_cache = self.draft_caches[0]
            self.draft = MTPDraftRunner(contract, self.draft_caches, runtime=runtime, precision=precision,
                                        num_threads=num_threads)

    def execute(self, seq_lens: Sequence[int], query_lens: Sequence[int], block_tables: Sequence[Sequence[int]],
                new_token_ids, num_logits: Sequence[int] | None = None) -> np.ndarray:
        """One step: per-sequence facts -> graph inputs -> logits [L, vocab] f32 (L = B: each
        sequence's last new token; more rows where num_logits asks for them, see metadata.py).
        The builder writes into the executor's inputs (one pass over the metadata, no copy after)."""
        return self.executor.execute(self.builder.build(seq_lens, query_lens, block_tables, new_token_ids,
                                                        num_logits, out=self.executor.metadata_tensors))

    def build(self, seq_lens, query_lens, block_tables, new_token_ids, num_logits=None) -> MLAMetadata:
        """A step's metadata in fresh arrays (tools that keep several steps)."""
        return self.builder.build(seq_lens, query_lens, block_tables, new_token_ids, num_logits)

    def apply_block_copies(self, src_to_dst) -> None:
        """The scheduler's block copies, in the order the cache manager decided them."""
        if len(src_to_dst):  # most steps copy nothing: no numpy call on the hot path
            copy_blocks([*self.kv_caches, *self.draft_caches], src_to_dst)

    def hidden_states(self) -> np.ndarray:
        """The last step's hidden_states output [T, hidden] (exports with an MTP draft), a view
        valid until the next step."""
        return self.executor.hidden_states()

    def describe(self) -> str:
        note = "; batch-invariant (attention pinned absorbed)" if self.batch_invariant else ""
        if self.draft is not None:
            note += f"; {self.draft.describe()}"
        return self.executor.describe() + note


def copy_blocks(kv_caches: Sequence[np.ndarray], src_to_dst) -> None:
    """Within each layer's cache, copy block s onto block d for each row (s, d) of the [N, 2]
    mapping, one row after the other (a block written by one row may be read by a later one)."""
    pairs = _block_pairs(src_to_dst)
    for cache in kv_caches:
        _check_ids(pairs, cache.shape[0], "block")
    for src, dst in pairs.tolist():
        for cache in kv_caches:
            cache[dst] = cache[src]


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
