"""`mla-export bench`: the end-to-end benchmark (tools/bench_e2e.py) against transformers and
optimum-intel on one checkpoint and one workload; the options are the tool's own."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_e2e.py"


def _tool():
    """The tool module (it lives in the source tree's tools/, not in the package)."""
    if not TOOL.exists():
        return None
    spec = importlib.util.spec_from_file_location("mla_export_bench_e2e", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def add_parser(subparsers) -> argparse.ArgumentParser:
    tool = _tool()
    doc = (tool.__doc__ if tool else __doc__).splitlines()[0]
    p = subparsers.add_parser("bench", help="end-to-end benchmark against transformers and optimum-intel",
                              description=doc)
    if tool is not None:
        tool.add_arguments(p)
    return p


def run(args) -> int:
    tool = _tool()
    if tool is None:
        print(f"mla-export bench: needs the source tree's {TOOL.relative_to(TOOL.parents[1])} (not part of an "
              "installed wheel)", file=sys.stderr)
        return 2
    return int(tool.run_bench(args) or 0)
