"""What every executor shares: its options, the check of the cache arrays it binds against the
contract, and the start-up check that the graph writes the caller's cache arrays in place.

Both runtimes make a private copy of a bound cache silently when the array does not match what
the op consumes (element type, layout); generation would then read a stale cache. One sentinel
step at start-up catches that, for OpenVINO and onnxruntime alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Sequence

import numpy as np

from ..formats.contract import Contract
from ..formats.kv_formats import BF16
from .cache_layout import CacheLayout
from .graph_feeds import graph_feeds
from .metadata import METADATA_INPUTS, MetadataBuffers, MLAMetadata, MLAMetadataBuilder

__all__ = ["PRECISIONS", "MLAExecutor", "CacheNotInPlaceError", "MetadataTensors", "check_options",
           "check_cache_bindings", "check_cache_written_in_place"]

PRECISIONS = ("f32", "bf16")
_SENTINEL = -1234.0  # exactly representable in bf16 and f16; no real cache row is all this value
_SENTINEL_BYTE = 0xA5  # quantised byte rows: a written row (codes, scale, k_pe) is never all 0xA5


class CacheNotInPlaceError(RuntimeError):
    """The runtime wrote a copy of the cache, not the caller's arrays."""


def check_options(precision: str, num_threads: int | None) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
        raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")


_NUMPY_DTYPES = {"u8": np.dtype(np.uint8), "f32": np.dtype(np.float32), "bf16": BF16, "f16": np.dtype(np.float16)}


def check_cache_bindings(contract: Contract, bound_caches: Sequence[np.ndarray], variant: str = "custom") -> None:
    """Each array bound to a graph's `kv_cache.<i>` input must be what the contract declares for
    that variant (element type, rank, static dims), C-contiguous and writable: any mismatch would
    make the runtime convert a private copy (writes lost) or write memory numpy thinks read-only.
    The graph itself is checked against the same contract when it is loaded."""
    names = CacheLayout.of(contract).names()
    if len(bound_caches) != len(names):
        raise ValueError(f"got {len(bound_caches)} cache arrays for {len(names)} cache inputs ({names[0]} .. {names[-1]})")
    specs = {s.name: s for s in contract.inputs(variant)}
    for name, arr in zip(names, bound_caches):
        if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
            raise ValueError(f"the cache bound to {name} must be a C-contiguous numpy array")
        if not arr.flags.writeable:
            raise ValueError(f"the cache bound to {name} is read-only (numpy writeable=False); it is written in place")
        spec = specs[name]
        if arr.dtype != _NUMPY_DTYPES.get(spec.dtype) or arr.ndim != len(spec.shape) or any(
                isinstance(s, int) and s != d for s, d in zip(spec.shape, arr.shape)):
            raise ValueError(f"graph input {name} is {spec.dtype} {list(spec.shape)}; "
                             f"the cache binds {arr.dtype} {list(arr.shape)}")


def check_cache_written_in_place(execute: Callable[[MLAMetadata], np.ndarray], kv_caches: Sequence[np.ndarray],
                                 who: str, binding_of: Callable[[int], str], names: Sequence[str] | None = None,
                                 out: MetadataBuffers | None = None) -> None:
    """Sentinel step: fill block 0 with a sentinel, run one token at slot 0, read the row back
    from every layer's numpy array. The block is zeroed again afterwards (it must be free).
    `who` names the runtime; `binding_of(i)` describes how layer i's cache is bound; `out`: the
    buffers the step is built into (an executor's own: the graph it picks for a one-token step)."""
    sentinel = [_SENTINEL_BYTE if c.dtype == np.uint8 else _SENTINEL for c in kv_caches]
    for cache, value in zip(kv_caches, sentinel):
        cache[0] = value
    nb, bs, _ = kv_caches[0].shape
    step = MLAMetadataBuilder(bs, nb, max_model_len=1).build([1], [1], [[0]], np.zeros(1, np.int32), out=out)
    logits = execute(step)
    stale = [i for i, c in enumerate(kv_caches) if np.all(c[0, 0] == sentinel[i])]
    for cache in kv_caches:
        cache[0] = 0
    if stale:
        names = names or [f"kv_cache.{i}" for i in range(len(kv_caches))]
        raise CacheNotInPlaceError(
            f"{who} did not write {names[stale[0]]} (and {len(stale) - 1} other caches) in place: it made a "
            f"private copy of the cache, so generation would read a stale cache ({binding_of(stale[0])}).")
    if not np.isfinite(logits).all():
        raise RuntimeError("the start-up step produced non-finite logits: the exported graph is broken")


class MetadataTensors(MetadataBuffers):
    """An executor's own int32 metadata inputs, handed to the builder to write a step into
    (`MLAMetadataBuilder.build(..., out=executor.metadata_tensors)`), so the graph reads the
    builder's arrays themselves: nothing is copied or checked again between the two.

    Each input has one grow-only int32 store; `array(name, shape)` returns a view of its first
    elements at that shape, the same array object as last time when the shape did not change (a
    steady decode step rebinds nothing). A store that must grow is replaced, never resized in
    place, so an array handed out before stays valid memory. `holds(metadata)` tells whether a
    step's arrays are the ones handed out last (then the builder made them: int32, the graph's
    ranks, values checked)."""

    def __init__(self):
        self._stores: dict[str, np.ndarray] = {}
        self._last: dict[str, np.ndarray] = {}
        # (num_seqs, num_tokens, needed) -> the block-table width the executor's graph for such a
        # step takes (decode_graphs.py: static decode graphs); None: as needed
        self.width_rule: Callable[[int, int, int], int] | None = None

    def table_width(self, num_seqs: int, num_tokens: int, needed: int) -> int:
        return needed if self.width_rule is None else self.width_rule(num_seqs, num_tokens, needed)

    def array(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        last = self._last.get(name)
        if last is not None and last.shape == shape:
            return last
        size = 1
        for d in shape:
            size *= d
        store = self._stores.get(name)
        if store is None or store.size < size:
            store = self._stores[name] = np.empty(max(size, 2 * (0 if store is None else store.size), 16), np.int32)
        arr = self._last[name] = store[:size].reshape(shape)
        return arr

    def holds(self, metadata: MLAMetadata) -> bool:
        last = self._last
        return all(getattr(metadata, name) is last.get(name) for name in METADATA_INPUTS)

    def take(self, metadata: MLAMetadata) -> dict[str, np.ndarray]:
        """The step's arrays as the graph's inputs, all of them this object's: the builder's own
        as they are; any other metadata checked (graph_feeds.py: int32 without a lossy cast, the
        graph's ranks, or a ValueError naming the input) and copied in."""
        if self.holds(metadata):
            return self._last
        feeds = graph_feeds(metadata)  # every input checked before any is written
        for name, arr in feeds.items():
            self.array(name, arr.shape)[...] = arr
        return self._last


class MLAExecutor(ABC):
    """What the backend needs of the executor of one runtime (backend.executor_class picks it):
    constructed on the caller's per-layer cache arrays, which it binds and writes in place (kept
    alive while bound), `execute(metadata) -> logits [B, vocab] f32`, `describe()`, and the
    start-up sentinel step. A new runtime is one subclass plus an entry in backend._IMPLS."""

    who = "the runtime"  # names the runtime in the sentinel step's error

    def __init__(self, contract: Contract, kv_caches: Sequence[np.ndarray], precision: str, num_threads: int | None):
        check_options(precision, num_threads)
        self.precision, self.num_threads = precision, num_threads
        self._kv_caches = list(kv_caches)
        self.cache_names = CacheLayout.of(contract).names()  # the graph input of each array
        self._bound: list[np.ndarray] = []  # the arrays the graph sees (set by the subclass)
        # The metadata inputs the graph reads, which the backend's builder writes into.
        self.metadata_tensors = MetadataTensors()

    @abstractmethod
    def execute(self, metadata: MLAMetadata) -> np.ndarray:
        """Run one step; logits [B, vocab] f32."""

    @abstractmethod
    def describe(self) -> str:
        """One line: runtime, graph file, precision and threads really in use."""

    def binding_note(self, layer: int) -> str:
        return f"bound {self._bound[layer].dtype} {list(self._bound[layer].shape)}"

    def check_cache_written_in_place(self, out: MetadataBuffers | None = None) -> None:
        """The start-up sentinel step (check_cache_written_in_place above), its metadata built into
        `out` (default fresh arrays)."""
        check_cache_written_in_place(self.execute, self._kv_caches, self.who, self.binding_note, self.cache_names,
                                     out=out)
