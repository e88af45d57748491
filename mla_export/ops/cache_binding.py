"""The one rule for how a latent cache array is bound to a graph or an op (both runtimes).

f32 caches are bound as they are; bf16 and f16 caches as the u8 view of their bytes (quantised
caches are u8 bytes already). Why: OpenVINO's CPU plugin converts a bf16 or f16 input of a
custom op into an f32 copy on CPUs without native bf16 (so the op's writes would be lost) but
passes u8 through untouched, and the exported graphs declare 16-bit caches as u8 for both
runtimes (contract.cache_layout). The MLA ops read a u8 cache in the format of their kv_dtype
attribute (absent: bf16). numpy and ml_dtypes only.
"""

from __future__ import annotations

import numpy as np

from ..formats.kv_formats import BF16

__all__ = ["cache_binding"]

_AS_BYTES = (BF16, np.dtype(np.float16))


def cache_binding(cache: np.ndarray) -> np.ndarray:
    """The array to bind for a cache: a view sharing `cache`'s memory (the op writes into it).
    Anything else (not C-contiguous, not an array) is returned as it is, for the caller's check to name."""
    if isinstance(cache, np.ndarray) and cache.dtype in _AS_BYTES and cache.flags.c_contiguous:
        return cache.view(np.uint8)
    return cache
