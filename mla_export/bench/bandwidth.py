"""A plain memory read's speed, measured beside every benchmark run: batch-1 decode follows the
host's memory bandwidth, and other tenants of a shared host move it minute by minute (25-50 GB/s
seen here), so a decode speed means something only next to the bandwidth measured around it.

N threads each take the max of their part of a buffer far larger than the L3 (default 1 GiB): a
vectorised reduction that keeps up with memory, where a float sum does not. numpy's reductions
release the GIL, so the threads read in parallel. Best of a few passes, GB/s (1e9 bytes/s). The
figure is a floor of what the machine reads (a vectorised C read with prefetch gets a little more):
it is for comparing moments, and a runtime's bytes/token x tokens/s over it is its efficiency.
"""

from __future__ import annotations

import threading
import time

import numpy as np

DEFAULT_MIB = 1024
DEFAULT_PASSES = 3


def read_gbps(threads: int = 2, passes: int = DEFAULT_PASSES, size_mib: int = DEFAULT_MIB) -> float:
    """GB/s of `threads` threads reading a `size_mib` MiB buffer, best of `passes` passes."""
    for name, v, lo in (("threads", threads, 1), ("passes", passes, 1), ("size_mib", size_mib, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    size = size_mib << 20
    a = np.ones(size // 4, np.float32)  # written once: every page is resident before the timed reads
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(passes):
        workers = [threading.Thread(target=np.maximum.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
    return best
