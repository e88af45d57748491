"""The cost of batch-invariant mode: one export loaded twice in one process (batch_invariant off
and on), prefill time of one prompt and decode speed, alternated A B A B, medians and ratios.

    python tools/bench_batch_invariant.py EXPORT --prompt-lens 1024 4096 --rounds 5

Prefix caching is off (each round prefills the whole prompt); random token ids; greedy. The
mode pins MlaPagedAttention absorbed, so the cost is prefill attention at long prompts; decode
runs absorbed in both. Report the CPU and the read bandwidth beside the figures
(tools/read_bandwidth.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def _engine(export: str, on: bool, threads: int | None, max_len: int):
    from mla_export.runtime import LLMEngine

    return LLMEngine(export, batch_invariant=on, num_threads=threads, enable_prefix_caching=False,
                     max_num_seqs=1, max_num_batched_tokens=max_len, max_model_len=max_len + 64)


def _one(engine, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """(seconds to the first token, decode tokens/s over the rest)."""
    from mla_export.runtime import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    engine.add_request(f"r{time.perf_counter_ns()}", prompt, params)
    start = time.perf_counter()
    first = None
    while engine.has_unfinished_requests():
        engine.step()
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return first - start, (new_tokens - 1) / (end - first)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export")
    ap.add_argument("--prompt-lens", type=int, nargs="+", default=[1024])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()
    longest = max(args.prompt_lens)
    engines = {False: _engine(args.export, False, args.threads, longest), True: _engine(args.export, True, args.threads, longest)}
    vocab = engines[False].facts.vocab_size
    rng = np.random.default_rng(0)
    results = []
    for n in args.prompt_lens:
        prompt = rng.integers(100, vocab - 100, n).tolist()
        for on in (False, True):  # warm-up
            _one(engines[on], prompt, 4)
        got = {False: [], True: []}
        for _ in range(args.rounds):
            for on in (False, True):
                got[on].append(_one(engines[on], prompt, args.new_tokens))
        row = {"prompt": n}
        for on, name in ((False, "off"), (True, "on")):
            row[f"ttft_s_{name}"] = statistics.median(t for t, _ in got[on])
            row[f"decode_tok_s_{name}"] = statistics.median(d for _, d in got[on])
        row["ttft_ratio_on_off"] = statistics.median(b[0] / a[0] for a, b in zip(got[False], got[True]))
        row["decode_ratio_on_off"] = statistics.median(b[1] / a[1] for a, b in zip(got[False], got[True]))
        results.append(row)
        print(f"prompt {n}: TTFT off {row['ttft_s_off']:.3f} s, on {row['ttft_s_on']:.3f} s (ratio {row['ttft_ratio_on_off']:.3f}); "
              f"decode off {row['decode_tok_s_off']:.1f} tok/s, on {row['decode_tok_s_on']:.1f} "
              f"(ratio {row['decode_ratio_on_off']:.3f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"export": args.export, "threads": args.threads, "rounds": args.rounds,
                       "new_tokens": args.new_tokens, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
