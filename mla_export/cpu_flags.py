"""The CPU's feature flags as Linux reports them (/proc/cpuinfo), for choices that depend on the
instruction sets at hand (the runtime's weight layouts; the tests' expectations)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

__all__ = ["cpu_flags"]


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first processor's flags (e.g. "avx512_vnni", "amx_int8"); empty where /proc/cpuinfo
    is missing (not Linux), so every feature reads as absent there."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
