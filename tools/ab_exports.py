"""Two exports of one checkpoint, side by side in one process: decode-step and prefill medians.

For exporter decisions (which op a weight runs on, which form a layer takes) that change a decode
step by 5-20%, which separate runs on this shared machine cannot resolve: both exports are loaded
into one process and run the same prompts in alternated rounds (A B A B ...), after a warm-up on
short prompts. Per round: the median decode-step time (steps where every sequence gets a token)
and the prefill time (the steps until every sequence has its first token). Reports the medians
over rounds and B/A. Not a test; no thresholds.

    python tools/ab_exports.py EXPORT_A EXPORT_B [--batch 1] [--prompt-len 1024] [--new 40] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mla_export.runtime import LLMEngine, SamplingParams  # noqa: E402


def run_round(engine: LLMEngine, prompts: list[list[int]], tag: str, params: SamplingParams) -> tuple[float, float]:
    """(prefill seconds, median decode-step seconds) of one batch of prompts."""
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", p, params)
    started: set[str] = set()
    prefill, steps = 0.0, []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t
        if len(started) < len(prompts):
            prefill += dt
            started.update(o.request_id for o in outs)
        elif len(outs) == len(prompts):
            steps.append(dt)
    return prefill, statistics.median(steps) if steps else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--new", type=int, default=40, help="new tokens per sequence")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name, value in (("--batch", args.batch), ("--prompt-len", args.prompt_len), ("--new", args.new),
                        ("--rounds", args.rounds)):
        if value < 1:
            raise SystemExit(f"{name} must be at least 1, got {value}")
    print(f"[ab_exports] seed {args.seed}, batch {args.batch}, prompt {args.prompt_len}, {args.new} new tokens, "
          f"{args.rounds} rounds, {args.threads} threads, {args.precision} hint", flush=True)
    rng = np.random.default_rng(args.seed)
    exports = {"A": args.a, "B": args.b}
    engines = {}
    for key, path in exports.items():
        engines[key] = LLMEngine(path, precision=args.precision, num_threads=args.threads,
                                 num_blocks=args.batch * -(-(args.prompt_len + args.new) // 16) + 8,
                                 max_num_seqs=args.batch, max_num_batched_tokens=2048, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True)
    vocab = engines["A"].contract.model["vocab_size"]
    warm = [rng.integers(100, vocab, 16).tolist() for _ in range(args.batch)]
    for key, engine in engines.items():
        run_round(engine, warm, f"warm-{key}", params)
    res = {k: {"prefill": [], "step": []} for k in engines}
    for r in range(args.rounds):
        prompts = [rng.integers(100, vocab, args.prompt_len).tolist() for _ in range(args.batch)]
        for key, engine in engines.items():  # A B A B ...: the same prompts, the same machine state
            pre, step = run_round(engine, prompts, f"r{r}-{key}", params)
            res[key]["prefill"].append(pre)
            res[key]["step"].append(step)
        print(f"round {r}: " + "  ".join(f"{k} step {res[k]['step'][-1] * 1e3:.2f} ms prefill {res[k]['prefill'][-1]:.3f} s"
                                         for k in engines), flush=True)
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in res.items()}
    for key, path in exports.items():
        print(f"{key} = {path}: decode step median {med[key]['step'] * 1e3:.2f} ms, prefill median {med[key]['prefill']:.3f} s")
    print(f"B/A decode step {med['B']['step'] / med['A']['step']:.3f}, prefill {med['B']['prefill'] / med['A']['prefill']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
