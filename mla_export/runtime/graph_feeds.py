"""Where a step's metadata enters an executor: the `MLAMetadata` arrays as the graph's int32
inputs (the contract's metadata dtype), for OpenVINO and onnxruntime alike.

Both runtimes take int32 metadata, and a numpy cast to int32 is silent: an int64 slot or token
id of 2**32 + k becomes k and a float position is truncated, so an invalid step would reach the
graph's MlaStepCheck as a valid one. So nothing is cast that does not survive the cast: integer
arrays whose values all fit int32 are converted, anything else is refused with a ValueError
naming the input. The ranks are checked here too (block_tables 2, the others 1): the OpenVINO
plugin refuses a wrong rank itself before any node runs, with a message that names no input.

The builder's int32 arrays pass with a dtype and rank check only (this runs on every step).
"""

from __future__ import annotations

import numpy as np

from .metadata import METADATA_INPUTS, MLAMetadata

__all__ = ["graph_feeds", "METADATA_RANKS"]

METADATA_RANKS = {name: 2 if name == "block_tables" else 1 for name in METADATA_INPUTS}
_INT32 = np.iinfo(np.int32)


def graph_feeds(metadata: MLAMetadata) -> dict[str, np.ndarray]:
    """name -> C-contiguous int32 array of the graph input's rank, for every metadata input."""
    return {name: _int32_input(name, getattr(metadata, name)) for name in METADATA_INPUTS}


def _int32_input(name: str, value) -> np.ndarray:
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    if arr.ndim != METADATA_RANKS[name]:
        raise ValueError(f"metadata input '{name}' must have rank {METADATA_RANKS[name]}, got shape {list(arr.shape)}")
    if arr.dtype == np.int32:
        return np.ascontiguousarray(arr)
    if arr.dtype.kind not in "iu":  # floats, bools, objects: no int32 value to run
        raise ValueError(f"metadata input '{name}' must hold integers (the graph takes int32), got {arr.dtype}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < _INT32.min or hi > _INT32.max:
            bad = lo if lo < _INT32.min else hi
            at = np.unravel_index(int(np.argmax(arr == bad)), arr.shape)
            raise ValueError(f"metadata input '{name}' holds {bad} at {list(map(int, at))}, outside the graph's int32 "
                             f"range (cast, it would run as {(bad + 2**31) % 2**32 - 2**31})")
    return np.ascontiguousarray(arr, dtype=np.int32)
