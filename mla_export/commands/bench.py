"""`mla-export bench`: the end-to-end benchmark (mla_export.bench.run) of an export directory or
a checkpoint against llama.cpp, the vLLM CPU engine, optimum-intel and transformers."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    from mla_export.bench.run import __doc__ as doc, add_arguments

    p = subparsers.add_parser("bench", help="end-to-end benchmark against llama.cpp, vLLM, optimum-intel, transformers",
                              description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_arguments(p)


def run(args) -> int:
    from mla_export.bench.run import run_bench

    return int(run_bench(args) or 0)
