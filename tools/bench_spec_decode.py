"""Speculative decoding with n-gram (or MTP) drafts against plain decoding, at batch 1: decode speed
(alternated A B A B, medians) and the cost of a verify step of k + 1 tokens against a 1-token step.

    python tools/bench_spec_decode.py EXPORT --k 3 --rounds 5 [--prompts prompts.json]
    python tools/bench_spec_decode.py EXPORT --method mtp --k 1      # an export with an MTP draft

The export is loaded twice in one process (plain, and with speculative_config), prefix caching
off (each run prefills its prompt), greedy, one request at a time. Without --prompts the prompt
set is planted repetition: random spans repeated (the continuation of such text can repeat
spans of the prompt, so drafts get accepted: an upper bound for text that repeats itself, to be
said so beside any figure). --prompts: a JSON list of strings or token-id lists. The verify
cost is measured on the graph alone (backend.execute) at a given context length, k + 1 new
tokens with k + 1 logits rows against 1, alternated, medians. Report the CPU, the export's
dims and dtype, and the acceptance rate beside the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def _engine(export: str, spec: dict | None, args):
    from mla_export.runtime import LLMEngine

    return LLMEngine(export, runtime=args.runtime, precision=args.precision, num_threads=args.threads,
                     enable_prefix_caching=False, max_num_seqs=1, speculative_config=spec)


def _prompts(args, vocab: int) -> list:
    if args.prompts:
        with open(args.prompts, encoding="utf-8") as f:
            prompts = json.load(f)
        if not isinstance(prompts, list) or not prompts:
            raise SystemExit(f"--prompts {args.prompts}: a non-empty JSON list of strings or token-id lists")
        return prompts
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, args.span).tolist() * args.repeats for _ in range(args.num_prompts)]


def _decode_run(engine, prompts: list, new_tokens: int) -> tuple[float, int]:
    """(decode seconds after each prompt's first token, summed; tokens decoded after the first)."""
    from mla_export.runtime import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    seconds, decoded = 0.0, 0
    for prompt in prompts:
        engine.add_request(f"r{time.perf_counter_ns()}", prompt, params)
        first, n = None, 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                n += len(out.new_token_ids)
                if out.error:
                    raise SystemExit(f"request failed: {out.error}")
            if first is None and n:
                first, n0 = time.perf_counter(), n
        seconds += time.perf_counter() - first
        decoded += n - n0
    return seconds, decoded


def _verify_cost(engine, context: int, k: int, reps: int) -> dict:
    """Graph time of one sequence at `context` cached tokens: 1 new token vs k + 1 (all with
    logits). The rows written land in blocks no request holds (the engine is idle)."""
    bs = engine.kv_cache.block_size
    need = -(-(context + k + 1) // bs)
    if need > engine.kv_cache.num_blocks or context + k + 1 > engine.max_model_len:
        raise SystemExit(f"--context {context}: more than this engine's cache or context holds")
    table = list(range(need))
    vocab = engine.facts.vocab_size
    times = {1: [], k + 1: []}
    for _ in range(reps):
        for q in (1, k + 1):
            ids = np.arange(q, dtype=np.int64) % vocab
            t0 = time.perf_counter()
            engine.backend.execute(seq_lens=[context + q], query_lens=[q], block_tables=[table],
                                   new_token_ids=[ids.tolist()], num_logits=None if q == 1 else [q])
            times[q].append(time.perf_counter() - t0)
    one, many = statistics.median(times[1]), statistics.median(times[k + 1])
    return {"context": context, "step_1_s": one, f"step_{k + 1}_s": many, "ratio": many / one}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export")
    ap.add_argument("--runtime", default="openvino", choices=("openvino", "onnxruntime"))
    ap.add_argument("--precision", default="bf16", choices=("bf16", "f32"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--method", default="ngram", choices=("ngram", "mtp"),
                    help="ngram, or mtp (the export's MTP draft graph; the --lookup-* options do not apply)")
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--lookup-min", type=int, default=1)
    ap.add_argument("--prompts", default=None, help="JSON list of prompts (default: planted repetition)")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--span", type=int, default=24, help="planted prompts: the random span's length")
    ap.add_argument("--repeats", type=int, default=4, help="planted prompts: times the span is repeated")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--context", type=int, nargs="+", default=[128], help="verify cost: cached tokens")
    ap.add_argument("--verify-reps", type=int, default=20)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()
    for name in ("k", "lookup_max", "lookup_min", "num_prompts", "span", "repeats", "new_tokens", "rounds",
                 "verify_reps", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": args.lookup_max,
            "prompt_lookup_min": args.lookup_min}
    if args.method == "mtp":
        spec = {"method": "mtp", "num_speculative_tokens": args.k}
    engines = {"plain": _engine(args.export, None, args), "spec": _engine(args.export, spec, args)}
    prompts = _prompts(args, engines["plain"].facts.vocab_size)
    for e in engines.values():  # warm-up
        _decode_run(e, prompts[:1], 4)
    before = dict(engines["spec"].stats())
    speed = {"plain": [], "spec": []}
    for _ in range(args.rounds):
        for name in ("plain", "spec"):
            seconds, decoded = _decode_run(engines[name], prompts, args.new_tokens)
            speed[name].append(decoded / seconds)
    after = engines["spec"].stats()
    drafts = after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]
    accepted = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
    steps = after["spec_decode_num_drafts"] - before["spec_decode_num_drafts"]
    result = {
        "decode_tok_s_plain": statistics.median(speed["plain"]),
        "decode_tok_s_spec": statistics.median(speed["spec"]),
        "speedup": statistics.median(b / a for a, b in zip(speed["plain"], speed["spec"])),
        "acceptance_rate": accepted / drafts if drafts else 0.0,
        "accepted_per_verify_step": accepted / steps if steps else 0.0,
    }
    print(f"decode at batch 1: plain {result['decode_tok_s_plain']:.1f} tok/s, {args.method} k={args.k} "
          f"{result['decode_tok_s_spec']:.1f} tok/s (speed-up {result['speedup']:.2f}x); acceptance "
          f"{result['acceptance_rate']:.2f}, {result['accepted_per_verify_step']:.2f} drafts accepted per verify step",
          flush=True)
    verify = [_verify_cost(engines["plain"], c, args.k, args.verify_reps) for c in args.context]
    for v in verify:
        print(f"verify step at context {v['context']}: 1 token {v['step_1_s'] * 1e3:.2f} ms, {args.k + 1} tokens "
              f"{v[f'step_{args.k + 1}_s'] * 1e3:.2f} ms (ratio {v['ratio']:.2f})", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"export": args.export, "runtime": args.runtime, "precision": args.precision,
                       "threads": args.threads, "speculative_config": spec, "rounds": args.rounds,
                       "new_tokens": args.new_tokens, "num_prompts": len(prompts), "decode": result,
                       "verify": verify}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
