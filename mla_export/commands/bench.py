"""`mla-export bench`: the end-to-end benchmark (mla_export.bench.run) of an export directory or
a checkpoint against llama.cpp, the vLLM CPU engine, optimum-intel and transformers;
`mla-export bench setup-peers PEER...` builds those peers' environments (mla_export.bench.setup_peers)."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    from mla_export.bench.run import __doc__ as doc, add_arguments
    from mla_export.bench.setup_peers import __doc__ as setup_doc, add_arguments as add_setup_arguments

    p = subparsers.add_parser("bench", help="end-to-end benchmark against llama.cpp, vLLM, optimum-intel, transformers",
                              description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    # An optional action: `bench [options]` runs the benchmark, `bench setup-peers ...` sets peers up.
    actions = p.add_subparsers(dest="bench_action", metavar="ACTION", required=False)
    setup = actions.add_parser("setup-peers", help="build the peer systems' environments (llamacpp, ik_llamacpp, vllm, optimum)",
                               description=setup_doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_setup_arguments(setup)
    return p


def run(args) -> int:
    if getattr(args, "bench_action", None) == "setup-peers":
        from mla_export.bench.setup_peers import run as setup

        return int(setup(args) or 0)
    from mla_export.bench.run import run_bench

    return int(run_bench(args) or 0)
