"""The exporter's seams with the file system: an old export replaced without a moment where
neither exists, with the signals held across the renames (export/signals.py says how signals
are handled; output_lock.py has the output lock and stale partials). Free disk is checked by
exporter._check_disk.

Used by exporter.py (`commit`); `replace_dir` is the same without the signal handling."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .signals import Terminated, mark_complete, signals_held
from .output_lock import remove_owner, write_owner

__all__ = ["replace_dir", "commit", "Terminated"]


def _swap(tmp: Path, out_dir: Path) -> Path | None:
    """tmp renamed to out_dir; an old out_dir renamed aside first (its owner recorded, see
    output_lock.py) and returned, for the caller to remove. A failed second rename puts it back."""
    if not out_dir.exists():
        tmp.rename(out_dir)
        return None
    aside = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    aside.rmdir()
    write_owner(aside)
    out_dir.rename(aside)
    try:
        tmp.rename(out_dir)
    except BaseException:
        aside.rename(out_dir)
        remove_owner(aside)
        raise
    return aside


def _remove_aside(aside: Path | None) -> None:
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
        remove_owner(aside)


def replace_dir(tmp: Path, out_dir: Path) -> None:
    """Move the finished export `tmp` to `out_dir`, replacing an old export there. The old one
    is first renamed aside (atomic), then the new one into place, then the old one removed: an
    interruption leaves either the old export, or the new one (plus at worst a hidden
    `.OUT.old-*` directory, cleaned by the next export), never neither."""
    _remove_aside(_swap(tmp, out_dir))


def commit(tmp: Path, out_dir: Path) -> None:
    """replace_dir with the signals held across the renames; from the moment the new export is
    in place the running command counts as complete (a signal after it exits 0). The old export
    is removed after that, interruptible by nothing but SIGKILL (then the next export cleans it)."""
    with signals_held():
        aside = _swap(tmp, out_dir)
        remove_owner(tmp)
        mark_complete()
    _remove_aside(aside)
