"""numpy <-> onnxruntime without copies (bf16 included), and session options with the mla-export
custom-op library registered: what the onnxruntime executor and the onnxruntime op runner share
(the counterpart of ov_tensors.py). Imports onnxruntime, numpy and ml_dtypes only (never onnx,
torch or openvino).
"""

from __future__ import annotations

import ctypes

import numpy as np

from .libraries import ort_ops_path
from ..formats.kv_formats import BF16

__all__ = ["BF16", "ONNX_BFLOAT16", "THREADS_CONFIG_KEY", "available", "library_path", "session_options", "ortvalue",
           "to_numpy"]

ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16, without importing onnx
THREADS_CONFIG_KEY = "mla_export.num_threads"  # read by custom_ops/onnxruntime/mla_ort_ops.cpp


def available() -> bool:
    """True when the onnxruntime custom-op library was built and installed."""
    return ort_ops_path() is not None


def library_path() -> str:
    path = ort_ops_path()
    if path is None:
        raise FileNotFoundError(
            "the mla-export onnxruntime custom-op library (libmla_export_ort.so) is not installed: "
            "run tools/fetch_ort_headers.sh (or pass -DMLA_ORT_INCLUDE_DIR) and reinstall the package")
    return path


def session_options(num_threads: int | None = None):
    """SessionOptions with the custom-op library registered. num_threads (default: onnxruntime's
    own default) sizes the intra-op pool the kernels run on, and the kernels' work split."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if num_threads is not None:
        if int(num_threads) < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        so.intra_op_num_threads = int(num_threads)
        so.add_session_config_entry(THREADS_CONFIG_KEY, str(int(num_threads)))
    so.register_custom_ops_library(library_path())
    return so


def ortvalue(arr: np.ndarray):
    """An OrtValue over arr's own memory (arr must be C-contiguous; bf16 included)."""
    import onnxruntime as ort

    if not arr.flags.c_contiguous:
        raise ValueError("only a C-contiguous array can be bound to onnxruntime without a copy")
    if arr.dtype == BF16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr.view(np.uint16), ONNX_BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(arr)


def to_numpy(value) -> np.ndarray:
    """An OrtValue's data as numpy (bf16 outputs as ml_dtypes.bfloat16)."""
    if value.data_type() == "tensor(bfloat16)":
        # onnxruntime's numpy() does not know bf16: copy the raw 16-bit words out of its buffer.
        shape = tuple(value.shape())
        out = np.empty(shape, dtype=BF16)
        if out.size:
            ctypes.memmove(out.ctypes.data, value.data_ptr(), out.nbytes)
        return out
    return value.numpy()
