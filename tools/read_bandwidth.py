#!/usr/bin/env python
"""A plain memory read speed beside a benchmark (batch-1 decode follows it, and other tenants of
this host move it): mla_export.bench.bandwidth.read_gbps, the figure `mla-export bench` measures
around every run.

    python tools/read_bandwidth.py [--threads 2] [--passes 5] [--mib 1024]
"""

from __future__ import annotations

import argparse
import sys

from mla_export.bench.bandwidth import DEFAULT_MIB, read_gbps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--passes", "--repeats", type=int, default=5, dest="passes")
    p.add_argument("--mib", type=int, default=DEFAULT_MIB, help=f"buffer MiB (default {DEFAULT_MIB}: far above an L3)")
    a = p.parse_args()
    for flag, v in (("--threads", a.threads), ("--passes", a.passes), ("--mib", a.mib)):
        if v < 1:
            print(f"tools/read_bandwidth.py: {flag} must be >= 1, got {v}", file=sys.stderr)
            return 2
    gbps = read_gbps(a.threads, a.passes, a.mib)
    print(f"read {gbps:.1f} GB/s ({a.threads} threads, {a.mib} MiB, best of {a.passes})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
