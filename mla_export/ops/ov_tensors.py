"""numpy <-> openvino.Tensor without copies, bf16 included.

openvino's Python binding does not know ml_dtypes.bfloat16, so bf16 arrays are shared through
their uint16 bits with an explicit element type. Sharing (not copying) is what lets the MLA
cache-write op update a caller's cache array in place; the caller must keep the array alive
while the tensor is in use (openvino does not hold a reference to it).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import openvino as ov

from .cache_binding import cache_binding  # noqa: F401 (the one rule; re-exported for older callers)

BF16 = np.dtype(ml_dtypes.bfloat16)

_OV_TYPES = {
    np.dtype(np.float32): ov.Type.f32,
    np.dtype(np.float16): ov.Type.f16,
    BF16: ov.Type.bf16,
    np.dtype(np.int32): ov.Type.i32,
    np.dtype(np.int64): ov.Type.i64,
    np.dtype(np.uint8): ov.Type.u8,
}


def ov_type(dtype) -> ov.Type:
    dtype = np.dtype(dtype)
    if dtype not in _OV_TYPES:
        raise TypeError(f"dtype {dtype} is not supported (f32, f16, bf16, i32, i64, u8)")
    return _OV_TYPES[dtype]


def shared_tensor(arr: np.ndarray) -> ov.Tensor:
    """An ov.Tensor over arr's own memory (arr must be C-contiguous)."""
    if not arr.flags.c_contiguous:
        raise ValueError("only a C-contiguous array can be shared with OpenVINO without a copy")
    if arr.dtype == BF16:
        return ov.Tensor(arr.view(np.uint16), ov.Shape(list(arr.shape)), ov.Type.bf16)
    ov_type(arr.dtype)  # validates the dtype
    return ov.Tensor(arr, shared_memory=True)


def to_numpy(t: ov.Tensor) -> np.ndarray:
    """A numpy copy of an output tensor (bf16 outputs come back as ml_dtypes.bfloat16)."""
    data = t.data
    if t.element_type == ov.Type.bf16:
        return np.array(data, copy=True).view(np.uint16).view(BF16)
    return np.array(data, copy=True)
