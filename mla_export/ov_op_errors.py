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

from . import extension_path

__all__ = ["error_count", "last_error", "checked_infer", "OpError"]

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
            _fns = (count, last)
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
