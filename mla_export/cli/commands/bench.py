"""`mla-export bench`: the end-to-end benchmark (mla_export.bench.run) of an export directory or
a checkpoint against llama.cpp, the vLLM CPU engine, optimum-intel and transformers;
`mla-export bench setup-peers PEER...` builds those peers' environments (mla_export.bench.setup_peers);
`mla-export bench quality` measures what the quantised formats cost (mla_export.bench.quality_run)."""

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
    from mla_export.bench.quality_run import __doc__ as quality_doc, add_arguments as add_quality_arguments

    quality = actions.add_parser("quality", help="KL divergence of quantised systems from their 16-bit base (ours and peers)",
                                 description=quality_doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_quality_arguments(quality)
    return p


def run(args) -> int:
    if getattr(args, "bench_action", None) == "setup-peers":
        from mla_export.bench.setup_peers import run as setup

        return int(setup(args) or 0)
    if getattr(args, "bench_action", None) == "quality":
        from mla_export.bench.quality_run import run_quality

        return run_quality(args)
    from mla_export.bench.run import run_bench

    return int(run_bench(args) or 0)
