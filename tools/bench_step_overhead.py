"""Per-step overhead of the runtime backend against the graph's own inference time.

For decode steps at batch 1 and 32 on an exported model (default: the tiny preset, exported to
a temporary directory), three medians over many steps:
  graph    the compiled model's own inference: `infer()` with every input already bound
  backend  what the backend adds per step: building the metadata from per-sequence facts
           (seq_lens, query_lens, block tables, new tokens) and binding it to the request
           (the executor's `bind`; the caches stay bound from start-up)
  engine   (informational) a whole `LLMEngine.step()`: scheduler, metadata, graph, sampling
The backend fraction is backend / (graph + backend); the target is under 5%. Each is reported
on the wall clock and on process CPU time (less distorted when other jobs share the cores).

    python tools/bench_step_overhead.py [OUT_DIR] [--steps 200] [--context 64] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _median_us(samples) -> float:
    return statistics.median(samples) * 1e6


def _export_tiny(tmp: Path) -> Path:
    from mla_export.cli import main

    out = tmp / "tiny"
    if main(["export", "--preset", "tiny", "-o", str(out)]) != 0:
        sys.exit("export of the tiny preset failed")
    return out


def bench_backend(engine, batch: int, context: int, steps: int) -> dict:
    """Decode steps for `batch` sequences of `context` cached tokens, timed piece by piece."""
    kv, builder, executor = engine.kv_cache, engine.builder, engine.executor
    rng = np.random.default_rng(0)
    vocab = engine.facts.vocab_size
    ids = [f"bench-{batch}-{i}" for i in range(batch)]
    for rid in ids:  # cache rows for `context` tokens (+ room for the decode tokens)
        if not kv.allocate_slots(rid, 0, context + steps):
            sys.exit(f"the cache is too small for {batch} x {context + steps} tokens")
    prompt = builder.build([context] * batch, [context] * batch, [kv.block_table(r) for r in ids],
                           rng.integers(0, vocab, size=batch * context))
    executor.execute(prompt)

    # Each part is timed on two clocks: wall time, and the process's CPU time (all threads),
    # which a busy shared machine distorts much less (with --threads 1 the two agree when idle).
    wall = {"build": [], "bind": [], "graph": []}
    cpu = {"build": [], "bind": [], "graph": []}
    for step in range(steps):
        seq_lens = [context + step + 1] * batch
        tokens = [[int(t)] for t in rng.integers(0, vocab, size=batch)]
        tables = [kv.block_table(r) for r in ids]
        w0, c0 = time.perf_counter(), time.process_time()
        md = builder.build(seq_lens, [1] * batch, tables, tokens)
        w1, c1 = time.perf_counter(), time.process_time()
        executor.bind(md)
        w2, c2 = time.perf_counter(), time.process_time()
        executor.run()
        w3, c3 = time.perf_counter(), time.process_time()
        for part, (w, c) in {"build": (w1 - w0, c1 - c0), "bind": (w2 - w1, c2 - c1), "graph": (w3 - w2, c3 - c2)}.items():
            wall[part].append(w)
            cpu[part].append(c)
    for rid in ids:
        kv.free(rid)
    result = {"batch": batch}
    for clock, samples in (("wall", wall), ("cpu", cpu)):
        med = {part: _median_us(v) for part, v in samples.items()}
        result[clock] = dict(med, fraction=(med["build"] + med["bind"]) / (med["graph"] + med["build"] + med["bind"]))
    return result


def bench_engine(engine, batch: int, context: int, steps: int) -> dict:
    from mla_export.runtime import SamplingParams

    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(1)
    for i in range(batch):
        engine.add_request(f"eng-{batch}-{i}", rng.integers(2, engine.facts.vocab_size, size=context).tolist(), params)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # prefill
    times = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return dict(batch=batch, engine_step_us=_median_us(times))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", help="an exported model directory (default: export the tiny preset)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    args = ap.parse_args(argv)

    from mla_export.runtime import LLMEngine

    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(args.out_dir) if args.out_dir else _export_tiny(Path(tmp))
        engine = LLMEngine(out_dir, precision=args.precision, num_threads=args.threads,
                           max_num_batched_tokens=4096, enable_prefix_caching=False)
        print(f"model {out_dir}, precision {args.precision}, threads {args.threads or 'default'}, "
              f"context {args.context}, {args.steps} decode steps; medians in us")
        print(f"{'batch':>5} {'clock':>5} {'graph':>9} {'build':>8} {'bind':>7} {'backend %':>10} {'engine step':>12}")
        for batch in (1, 32):
            b = bench_backend(engine, batch, args.context, args.steps)
            e = bench_engine(engine, batch, args.context, args.steps)
            for clock in ("wall", "cpu"):
                r = b[clock]
                step = f"{e['engine_step_us']:>12.1f}" if clock == "wall" else ""
                print(f"{batch:>5} {clock:>5} {r['graph']:>9.1f} {r['build']:>8.1f} {r['bind']:>7.1f} "
                      f"{100 * r['fraction']:>9.2f}% {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
