"""The IR's weights read into anonymous memory that asks for transparent huge pages.

By default OpenVINO maps the .bin file and the compiled model's constants (every int8/int4
weight our ops stream) stay in that file mapping: 4 KiB page-cache pages, so streaming 1-16 GB
of weights per decode step walks a page table entry every 4 KiB (and, in a VM, the host's table
behind it). Read into an anonymous mapping with MADV_HUGEPAGE instead, the same bytes sit in
2 MiB pages where the kernel has them (THP "always" or "madvise", the common defaults):
measured on the 3-layer V2-Lite-shaped int8 export (batch-8 decode step, 2 threads, Xeon VM,
alternated, docs/BENCHMARKS.md) 64.6-69.0 ms mapped against 57.6-62.2 ms from this buffer (in
4 KiB anonymous pages it was ~2.5 ms slower than in huge ones), with the same resident memory
(the file mapping's pages were resident too). The read drops the file's page-cache pages as it
goes (a second copy of every byte, which only crowds out huge pages; a second process loading the
same export reads it from disk again).

The buffer is read once at start-up (sequential reads, as fast as the file system), must outlive
the compiled model (the constants point into it: OpenVINO shares a weights tensor's memory), and
is never written after. `MLA_EXPORT_WEIGHTS_MMAP=1` keeps OpenVINO's file mapping (an A/B switch,
and the way to let the kernel evict weights under memory pressure instead of swapping them).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import openvino as ov

from .. import envs

_READ_CHUNK = 64 << 20  # bytes per read call: bounded, so a short read is reported where it happened


def use_file_mapping() -> bool:
    """Whether the user asked for OpenVINO's own file mapping (MLA_EXPORT_WEIGHTS_MMAP=1)."""
    return envs.MLA_EXPORT_WEIGHTS_MMAP


def read_weights(bin_path: Path) -> tuple[mmap.mmap, int]:
    """The whole file in a private anonymous mapping (huge pages requested before the first
    touch), and the file's size in bytes."""
    size = bin_path.stat().st_size
    buf = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP compiled out or disabled: 4 KiB anonymous pages, still correct
            pass
    view = memoryview(buf)
    try:
        with open(bin_path, "rb", buffering=0) as f:
            done = 0
            # The page cache's copy of what was just read is dropped as the read goes: the bytes
            # now live in this buffer, and the kernel finds 2 MiB pages for it more often when
            # free memory is not all page cache (27-layer V2-Lite int8, 15.9 GB, loaded with the
            # page cache full after a benchmark, Zen 4, one load each: 14.3 GB of it in huge
            # pages without the drop, 15.5 GB with; the decode step 103.9 / 102.6 ms, within noise).
            drop = hasattr(os, "posix_fadvise")
            while done < size:
                n = f.readinto(view[done:min(size, done + _READ_CHUNK)])
                if not n:
                    raise OSError(f"{bin_path}: the file ended at byte {done} of {size} while reading the weights")
                if drop:
                    os.posix_fadvise(f.fileno(), done, n, os.POSIX_FADV_DONTNEED)
                done += n
    finally:
        view.release()
    return buf, size


def read_ir(core: ov.Core, xml_path: Path, bin_path: Path) -> tuple[ov.Model, mmap.mmap | None]:
    """The IR with its weights in huge-page memory, and that memory (keep it alive with the model);
    (model, None) under MLA_EXPORT_WEIGHTS_MMAP=1, when the IR has no weights file, or where
    anonymous mappings do not exist."""
    if use_file_mapping() or not bin_path.is_file() or not hasattr(mmap, "MAP_ANONYMOUS"):
        return core.read_model(str(xml_path)), None  # (no anonymous mmap: not a POSIX system)
    buf, size = read_weights(bin_path)
    weights = ov.Tensor(np.frombuffer(buf, dtype=np.uint8, count=size), shared_memory=True)
    return core.read_model(xml_path.read_text(encoding="utf-8"), weights), buf
