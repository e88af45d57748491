"""Failures of the MLA ops inside OpenVINO that the plugin itself may not report.

OpenVINO's CPU plugin (2026.4.1) loses an exception thrown by a node when it runs the graph on a
single thread (INFERENCE_NUM_THREADS=1, or a one-core machine): `infer()` returns as if the step
had run, with stale or zero outputs (a bad block_tables gave all-zero logits). The extension
therefore counts every op failure and keeps the last message; `checked_infer` compares the count
around `infer()` and raises the op's own error when it moved. (One step runs at a time per
executor; with several threads inferring at once an error could be attributed to the wrong call,
but it is never lost.)
"""

from __future__ import annotations

import ctypes
import threading

from .libraries import extension_path

__all__ = ["error_count", "last_error", "checked_infer", "step_check", "OpError"]

_lock = threading.Lock()
_fns = None


class OpError(RuntimeError):
    """An MLA op rejected its inputs (the message names the op, the input and the bad value)."""


def _lib():
    global _fns
    with _lock:
        if _fns is None:
            lib = ctypes.CDLL(extension_path())  # the handle OpenVINO already loaded: same globals
            count = lib.mla_export_ov_error_count
            count.restype = ctypes.c_uint64
            last = lib.mla_export_ov_last_error
            last.restype = ctypes.c_size_t
            last.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            check = lib.mla_export_step_check
            check.restype = ctypes.c_int
            check.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)] + \
                [ctypes.c_int64] * 7 + [ctypes.c_char_p, ctypes.c_size_t]
            _fns = (count, last, check)
        return _fns


def error_count() -> int:
    return int(_lib()[0]())


def last_error() -> str:
    last = _lib()[1]
    buf = ctypes.create_string_buffer(4096)
    last(buf, len(buf))
    return buf.value.decode("utf-8", "replace")


def checked_infer(request) -> None:
    """request.infer(), raising OpError when an MLA op failed during it, even if the plugin lost
    the exception."""
    before = error_count()
    request.infer()
    if error_count() != before:
        raise OpError(last_error())


def step_check(feeds: dict, *, num_blocks: int, block_size: int, row_width: int, num_layers: int, vocab_size: int,
               max_positions: int) -> None:
    """The graph's MlaStepCheck on a step's int32 metadata, outside any graph; raises OpError.
    (The OpenVINO executor runs it before a single-thread infer() on the arrays of
    runtime/graph_feeds.py: see mla_ops.cpp.) Nothing is cast here: a cast to int32 could turn
    an invalid value into a valid one."""
    import numpy as np

    from .. import ops

    metadata = [i for i in ops.op("MlaStepCheck")["inputs"] if not i.get("variadic")]  # in the C call's order
    names = [i["name"] for i in metadata]
    arrays = [np.ascontiguousarray(feeds[n]) for n in names]
    for i, a in zip(metadata, arrays):
        if a.dtype != np.int32:
            raise OpError(f"MlaStepCheck: input '{i['name']}' must be int32, got {a.dtype}")
        if a.ndim != i["rank"]:
            raise OpError(f"MlaStepCheck: input '{i['name']}' must have rank {i['rank']}, got shape {list(a.shape)}")
    ptrs = (ctypes.c_void_p * 7)(*[a.ctypes.data for a in arrays])
    lens = (ctypes.c_int64 * 7)(*[a.shape[0] for a in arrays])
    err = ctypes.create_string_buffer(4096)
    bt = arrays[names.index("block_tables")]
    if _lib()[2](ptrs, lens, bt.shape[1], num_blocks, block_size, row_width, num_layers, vocab_size, max_positions,
                 err, len(err)):
        raise OpError(err.value.decode("utf-8", "replace"))
