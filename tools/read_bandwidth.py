#!/usr/bin/env python
"""A plain memory read speed beside a benchmark (batch-1 decode follows it, and other tenants of
this host move it): N threads each take the max of their part of a 1 GiB array (a vectorised
reduction that keeps up with memory, where a float sum does not), best of R passes, GB/s.

    python tools/read_bandwidth.py [--threads 2] [--repeats 5]

numpy's reductions release the GIL, so the threads read in parallel; the figure is a floor of what
the machine reads (a vectorised C read with prefetch gets a little more), for comparing moments.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np


def read_gbps(threads: int = 2, repeats: int = 5, size: int = 1 << 30) -> float:
    a = np.ones(size // 4, np.float32)
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(repeats):
        workers = [threading.Thread(target=np.maximum.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, size / (time.perf_counter() - t0) / 1e9)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    print(f"read {read_gbps(a.threads, a.repeats):.1f} GB/s ({a.threads} threads, best of {a.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
