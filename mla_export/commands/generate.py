"""`mla-export generate OUT_DIR`: generate a continuation with the runtime (no torch)."""

from __future__ import annotations

import argparse
import json
import sys
import time


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="generate text from an exported model directory",
                              description=__doc__.splitlines()[0])
    p.add_argument("out_dir", metavar="OUT_DIR", help="a directory written by `mla-export export`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs the model's tokenizer)")
    src.add_argument("--prompt-ids", help="prompt token ids, comma-separated: 1,2,3")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print token ids and timings as JSON")
    p.add_argument("--precision", choices=("f32", "bf16"), default="bf16", help="inference precision hint")
    p.add_argument("--threads", type=int, default=None, help="inference threads (default: the plugin's)")
    p.add_argument("--runtime", choices=("openvino", "onnxruntime"), default="openvino")
    return p


def _prompt(args):
    if args.prompt is not None:
        return args.prompt
    try:
        ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}") from None
    return ids


def run(args) -> int:
    from mla_export.runtime import LLMEngine, SamplingParams

    try:
        prompt = _prompt(args)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed)
        engine = LLMEngine(args.out_dir, runtime=args.runtime, precision=args.precision, num_threads=args.threads,
                           max_num_seqs=1)
        start = time.perf_counter()
        engine.add_request("cli", prompt, params)
    except (ValueError, FileNotFoundError) as e:
        print(f"mla-export generate: {e}", file=sys.stderr)
        return 2

    first_token_at = None
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if first_token_at is None:
                first_token_at = time.perf_counter()
            if not args.json and engine.tokenizer is None:
                print(*out.new_token_ids, end=" ", flush=True)
            final = out
    end = time.perf_counter()

    decode_tokens = len(final.token_ids) - 1  # tokens after the first one
    decode_time = end - first_token_at
    if args.json:
        print(json.dumps({
            "prompt_token_ids": final.prompt_token_ids,
            "token_ids": final.token_ids,
            "text": final.text,
            "finish_reason": final.finish_reason,
            "time_to_first_token_s": first_token_at - start,
            "decode_tokens_per_s": decode_tokens / decode_time if decode_tokens and decode_time > 0 else None,
            "total_time_s": end - start,
            "runtime": engine.executor.describe(),
        }, indent=2))
    elif engine.tokenizer is not None:
        print(final.text)
    else:
        print()
    return 0
