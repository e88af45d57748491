"""Engine flags that `generate`, `chat` and `serve` (one process or Ray replicas) share, each
with vLLM's spelling where vLLM has one."""

from __future__ import annotations

import argparse


def _batches(text: str) -> tuple[int, ...]:
    from mla_export.runtime.decode_graphs import parse_batches

    try:
        return parse_batches(text, "--decode-graph-batches")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_decode_graph_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--enforce-eager", action="store_true",
                   help="run every step on the dynamic graph: no static decode graphs (vLLM's flag for no CUDA graphs)")
    p.add_argument("--decode-graph-batches", type=_batches, default=None, metavar="B,B,...",
                   help="decode batch sizes compiled once more with static shapes, as vLLM captures CUDA graphs "
                        "(OpenVINO; default 1,2,4,8 up to the max sequences; '' = none; docs/ARCHITECTURE.md)")


def decode_graph_kwargs(args) -> dict:
    """The LLMEngine arguments of the two flags."""
    return {"enforce_eager": args.enforce_eager, "decode_graph_batches": args.decode_graph_batches}
