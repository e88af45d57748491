"""Check an lm-evaluation-harness run against `mla-export serve`: every loglikelihood it logged
(`--log_samples`, multiple-choice tasks) equals the engine's own, computed offline with
`LLM.generate(..., SamplingParams(prompt_logprobs=0))` on the same export, and every is_greedy flag
equals whether the continuation is the engine's greedy choice token by token.

The continuation's tokens are lm-eval 0.4's for an API model with a Hugging Face tokenizer:
trailing spaces of the context move to the continuation, the pair is encoded whole without
special tokens and split after the context's own encoding.

    python tools/lm_eval/check_loglikelihoods.py --export out/tiny --samples RUN/samples_task_*.jsonl
    [--dtype float32]   (the server's --dtype: compare like with like)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]
    whole = tok.encode(context + continuation, add_special_tokens=False).ids
    ctx = tok.encode(context, add_special_tokens=False).ids
    return ctx, whole[len(ctx):]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", required=True, help="the export directory the server served")
    ap.add_argument("--samples", nargs="+", required=True, help="lm-eval's samples_*.jsonl files")
    ap.add_argument("--dtype", default="float32", help="the server's --dtype (default float32)")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="absolute, on each loglikelihood")
    args = ap.parse_args(argv)

    from mla_export import LLM, SamplingParams

    llm = LLM(model=args.export, dtype=args.dtype)
    tok = llm.get_tokenizer()
    checked, worst, bad = 0, 0.0, []
    for path in args.samples:
        for line in Path(path).read_text().splitlines():
            sample = json.loads(line)
            for gen_args, resp in zip(sample["arguments"].values(), sample["resps"]):
                if not isinstance(gen_args.get("arg_1"), str):
                    continue  # generate_until: nothing to compare here
                ctx, cont = encode_pair(tok, gen_args["arg_0"], gen_args["arg_1"])
                out = llm.generate([ctx + cont], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
                entries = out.prompt_logprobs[len(ctx):]
                ours = sum(e[t].logprob for e, t in zip(entries, cont))
                greedy = all(e[t].rank == 1 for e, t in zip(entries, cont))
                theirs, their_greedy = float(resp[0][0]), resp[0][1] in (True, "True")
                worst = max(worst, abs(ours - theirs))
                checked += 1
                if not math.isclose(ours, theirs, abs_tol=args.tolerance) or greedy != their_greedy:
                    bad.append((sample["doc_id"], gen_args["arg_1"], theirs, ours, their_greedy, greedy))
    print(f"{checked} loglikelihoods checked, largest difference {worst:.2e}")
    for doc, cont, theirs, ours, tg, og in bad:
        print(f"  MISMATCH doc {doc} {cont!r}: lm-eval {theirs:.6f} (greedy {tg}), engine {ours:.6f} (greedy {og})")
    if checked == 0:
        print("no loglikelihood samples found (run lm_eval with --log_samples on a multiple-choice task)")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
