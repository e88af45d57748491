"""Static decode graphs against the dynamic graph, in one process on one loaded export.

    python tools/bench_decode_graphs.py EXPORT_DIR [--prompt-len 1024] [--batch 1] [--rounds 4]
        [--tokens 32] [--threads 2]

One engine with the static decode graph of --batch (runtime/decode_graphs.py). Each round
prefills --batch prompts, then decodes --tokens steps with the static graph and --tokens steps
on the dynamic graph (the order alternating between rounds), the same sequences going on, so both
see the same cache lengths give or take --tokens. Reports each round's median decode step (ms) of
both and the ratio; medians over rounds. The same engine, weights and cache: the difference is
the graph alone (OpenVINO's per-call shape inference of our ops; docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mla_export.runtime import LLMEngine, SamplingParams  # noqa: E402


def decode_steps(engine: LLMEngine, n: int, batch: int) -> list[float]:
    times = []
    while len(times) < n:
        t = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t
        if len(outs) != batch:
            raise RuntimeError(f"a step returned {len(outs)} outputs for {batch} sequences (not a decode step; "
                               f"preemptions so far: {engine.stats()['num_preemptions']})")
        times.append(dt)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32, help="decode steps per graph per round")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    if min(a.prompt_len, a.batch, a.rounds, a.tokens) < 1:
        ap.error("--prompt-len, --batch, --rounds and --tokens must be positive")
    # The first sequences decode while the later ones' prompts run (chunked prefill), so each gets
    # room for 64 tokens beyond the measured steps: none may finish before the last round ends.
    new_tokens = 2 * a.rounds * a.tokens + 64
    total = a.prompt_len + new_tokens
    engine = LLMEngine(a.export_dir, num_threads=a.threads, max_num_seqs=a.batch, max_num_batched_tokens=2048,
                       enable_prefix_caching=False, decode_graph_batches=[a.batch], max_model_len=total)
    ex = engine.executor
    if ex.decode_graphs is None:
        print(f"no static decode graph: {ex.describe()}", file=sys.stderr)
        return 1
    rule = ex.metadata_tensors.width_rule  # None = every step as wide as needed: the dynamic graph
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for b in range(a.batch):
        engine.add_request(f"r{b}", [5 + (b + i) % 1000 for i in range(a.prompt_len)], params)
    started: set[str] = set()
    while len(started) < a.batch:  # prefill until every sequence has its first token
        started.update(o.request_id for o in engine.step())
    rounds = []
    for r in range(a.rounds):
        got = {}
        for static in ((True, False) if r % 2 == 0 else (False, True)):
            ex.metadata_tensors.width_rule = rule if static else None
            times = decode_steps(engine, a.tokens, a.batch)
            ran_static = ex.request is ex.decode_graphs.decode_graph(a.batch).request
            if ran_static != static:
                raise RuntimeError("the step did not run on the graph asked for")
            got["static" if static else "dynamic"] = statistics.median(times) * 1e3
        got["ratio"] = got["dynamic"] / got["static"]
        rounds.append(got)
        print(f"round {r + 1}: static {got['static']:.2f} ms, dynamic {got['dynamic']:.2f} ms, "
              f"dynamic/static {got['ratio']:.3f}", flush=True)
    ex.metadata_tensors.width_rule = rule
    med = {k: statistics.median(g[k] for g in rounds) for k in ("static", "dynamic", "ratio")}
    print(json.dumps({"export": str(a.export_dir), "prompt_len": a.prompt_len, "batch": a.batch,
                      "threads": a.threads, "rounds": rounds, "median": med, "runtime": ex.describe()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
