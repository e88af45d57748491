"""The exporter's seams with the file system and the process: an old export replaced without a
moment where neither exists, and SIGTERM (what `timeout`, systemd and containers send) unwinding
like Ctrl-C so the temporary directory is removed. (Free disk is checked by exporter._check_disk.)

Used by exporter.py (`replace_dir`) and commands/export.py (`sigterm_unwinds`)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import threading
from pathlib import Path

__all__ = ["replace_dir", "sigterm_unwinds", "Terminated"]


class Terminated(BaseException):
    """SIGTERM, raised where the process was, so `finally`/`except BaseException` clean-ups run."""


def replace_dir(tmp: Path, out_dir: Path) -> None:
    """Move the finished export `tmp` to `out_dir`, replacing an old export there. The old one
    is first renamed aside (atomic), then the new one into place, then the old one removed: an
    interruption leaves either the old export, or the new one (plus at worst a hidden
    `.OUT.old-*` directory), never neither; a failed second rename puts the old one back."""
    if not out_dir.exists():
        tmp.rename(out_dir)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    aside.rmdir()
    out_dir.rename(aside)
    try:
        tmp.rename(out_dir)
    except BaseException:
        aside.rename(out_dir)
        raise
    shutil.rmtree(aside, ignore_errors=True)


class SignalState:
    fired = False  # SIGTERM arrived
    interrupted = False  # SIGINT (Ctrl-C) arrived


@contextlib.contextmanager
def sigterm_unwinds():
    """Within the block, SIGTERM raises Terminated and SIGINT KeyboardInterrupt in the main
    thread (a no-op elsewhere). The yielded state's flags stay set afterwards: a library may turn the exception into one of
    its own (safetensors was seen to raise a ValueError instead), so callers check the flag."""
    state = SignalState()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def on_term(signum, frame):
        state.fired = True
        raise Terminated()

    def on_int(signum, frame):
        state.interrupted = True
        raise KeyboardInterrupt()

    old_term = signal.signal(signal.SIGTERM, on_term)
    old_int = signal.signal(signal.SIGINT, on_int)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
