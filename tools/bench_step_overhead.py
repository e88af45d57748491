"""Per-step overhead of the runtime backend against the graph's own inference time.

For decode steps at batch 1 and 32 on an exported model (default: the tiny preset, exported to
a temporary directory), three medians over many steps:
  graph    the compiled model's own inference: `infer()` with every input already bound
  backend  what the backend adds per step: building the metadata from per-sequence facts
           (seq_lens, query_lens, block tables, new tokens) and binding it to the request
           (the executor's `bind`; the caches stay bound from start-up)
  engine   (informational) a whole `LLMEngine.step()`: scheduler, metadata, graph, sampling
The backend fraction is backend / (graph + backend); the target is under 5%.

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

    build_t, bind_t, graph_t = [], [], []
    for step in range(steps):
        seq_lens = [context + step + 1] * batch
        tokens = [[int(t)] for t in rng.integers(0, vocab, size=batch)]
        tables = [kv.block_table(r) for r in ids]
        t0 = time.perf_counter()
        md = builder.build(seq_lens, [1] * batch, tables, tokens)
        t1 = time.perf_counter()
        executor.bind(md)
        t2 = time.perf_counter()
        executor.run()
        t3 = time.perf_counter()
        build_t.append(t1 - t0)
        bind_t.append(t2 - t1)
        graph_t.append(t3 - t2)
    for rid in ids:
        kv.free(rid)
    build, bind, graph = _median_us(build_t), _median_us(bind_t), _median_us(graph_t)
    return dict(batch=batch, graph_us=graph, build_us=build, bind_us=bind,
                backend_fraction=(build + bind) / (graph + build + bind))


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
        print(f"model {out_dir}, precision {args.precision}, context {args.context}, {args.steps} decode steps")
        print(f"{'batch':>5} {'graph us':>10} {'build us':>10} {'bind us':>10} {'backend %':>10} {'engine step us':>15}")
        for batch in (1, 32):
            b = bench_backend(engine, batch, args.context, args.steps)
            e = bench_engine(engine, batch, args.context, args.steps)
            print(f"{batch:>5} {b['graph_us']:>10.1f} {b['build_us']:>10.1f} {b['bind_us']:>10.1f} "
                  f"{100 * b['backend_fraction']:>9.2f}% {e['engine_step_us']:>15.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
