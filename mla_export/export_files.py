"""The files of an export tied together: each one's size and a cheap digest, recorded in
mla_graph.json (`export.files`) at export time and checked at load, so a graph from another
export, a changed or truncated weights file, or a tokenizer swapped in is a clear error instead
of garbage output.

The digest is BLAKE2b over the file's size and 64 evenly spaced 64 KiB samples (the whole file
when it is smaller than that): about 4 MiB read whatever the file's size, so a 30 GB weights file
is checked in milliseconds. It catches a different or partly rewritten file, not a deliberate
forgery (it is no signature)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["digest", "describe_files", "check_files"]

_SAMPLES = 64
_SAMPLE = 64 << 10


def digest(path: str | Path) -> str:
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=16)
    h.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        if size <= _SAMPLES * _SAMPLE:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:
            step = (size - _SAMPLE) // (_SAMPLES - 1)
            for i in range(_SAMPLES):
                f.seek(i * step)
                h.update(f.read(_SAMPLE))
    return h.hexdigest()


def describe_files(out_dir: str | Path, names) -> dict:
    """{name: {"size": bytes, "digest": hex}} for the given files of out_dir."""
    out_dir = Path(out_dir)
    return {n: {"size": (out_dir / n).stat().st_size, "digest": digest(out_dir / n)} for n in sorted(set(names))}


def check_files(out_dir: str | Path, recorded: dict) -> None:
    """Raise ContractError when a recorded file changed size or digest."""
    from .contract import ContractError
    from .export_paths import inside

    for name, want in recorded.items():
        path = inside(out_dir, name, "export.files")
        if not path.is_file():
            raise ContractError(f"{out_dir}: {name} (recorded in mla_graph.json) is missing")
        size = path.stat().st_size
        if size != want.get("size"):
            raise ContractError(f"{out_dir}: {name} is {size} bytes, the export wrote {want.get('size')}: it was "
                                "changed or truncated after the export (export again)")
        if digest(path) != want.get("digest"):
            raise ContractError(f"{out_dir}: {name} differs from the file the export wrote (digest mismatch): "
                                "the export's files do not belong together (export again)")
