"""A benchmark checkpoint whose greedy text repeats itself: a copy of a (random-weight) checkpoint
in which token t is followed by pi(t), pi a permutation of the vocabulary made of cycles of
--cycle tokens, and prompts that are such cycles repeated. With random weights a model's greedy
output never repeats (n-gram drafts then find nothing to propose); here the continuation of every
prompt repeats the prompt's own spans, so speculative decoding with n-gram drafts sees them
accepted. Compute and memory traffic are those of the source checkpoint (same shapes and
formats; the MoE routing stays random): speed measured on it is an upper bound for text that
repeats itself, to be said so beside any figure.

    python tools/plant_successor.py SRC OUT [--cycle 64] [--damp 1e-3] [--prompts-out OUT/prompts.json]

How: lm_head row v becomes the embedding row of pi^-1(v), so the logits of a hidden state close
to embed(t) peak at pi(t) (a random 2048-wide row is far closer to itself than to any other);
the sub-layers' output projections (o_proj, down_proj, the experts' down_proj) are scaled by
--damp, so the residual stream stays close to the input token's embedding. Everything else,
config.json and the tokenizer files are copied unchanged. Writes OUT/prompts.json: --num-prompts
token-id prompts, each one cycle of pi repeated --repeats times (tools/bench_spec_decode.py
--prompts).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mla_export.checkpoint.reader import SafetensorsFile  # noqa: E402
from mla_export.checkpoint.writer import save_safetensors  # noqa: E402

def successor(vocab: int, cycle: int, rng) -> np.ndarray:
    """pi as an array (pi[t] = the token after t): cycles of `cycle` tokens over a shuffled vocabulary
    (a last shorter cycle takes the rest)."""
    order = rng.permutation(vocab)
    nxt = np.empty(vocab, np.int64)
    for s in range(0, vocab, cycle):
        c = order[s:s + cycle]
        nxt[c] = np.roll(c, -1)
    return nxt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--cycle", type=int, default=64, help="tokens in each cycle of pi")
    ap.add_argument("--damp", type=float, default=1e-3, help="scale of the sub-layers' output projections")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="times a prompt repeats its cycle")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts-out", default=None, help="default: OUT/prompts.json")
    args = ap.parse_args()
    src, out = Path(args.src), Path(args.out)
    if args.cycle < 2 or args.num_prompts < 1 or args.repeats < 2 or not 0 <= args.damp <= 1:
        raise SystemExit("--cycle >= 2, --num-prompts >= 1, --repeats >= 2, 0 <= --damp <= 1")
    shards = sorted(src.glob("*.safetensors"))
    if not shards or not (src / "config.json").is_file():
        raise SystemExit(f"{src}: no config.json / *.safetensors")
    if out.exists():
        raise SystemExit(f"{out} exists")
    config = json.loads((src / "config.json").read_text())
    if config.get("tie_word_embeddings"):
        raise SystemExit("tied embeddings: lm_head cannot differ from the embedding here")
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    files = [SafetensorsFile(shard) for shard in shards]
    embed = next(f.array("model.embed_tokens.weight") for f in files if "model.embed_tokens.weight" in f.entries)
    vocab = embed.shape[0]
    rng = np.random.default_rng(args.seed)
    nxt = successor(vocab, args.cycle, rng)
    prev = np.empty_like(nxt)
    prev[nxt] = np.arange(vocab)
    damped = ("self_attn.o_proj.weight", "down_proj.weight")  # dense, shared and routed experts' down_proj
    for f in files:
        planted = {}
        for name in f.entries:
            if name == "lm_head.weight":
                arr = embed[prev]
            elif name == "model.embed_tokens.weight":
                arr = embed  # read once, above
            else:
                arr = f.array(name)
                if name.startswith("model.layers.") and name.endswith(damped):
                    arr = (arr.astype(np.float32) * args.damp).astype(arr.dtype)
            planted[name] = arr
        save_safetensors(out / f.path.name, planted, metadata=f.metadata)
        f.close()
    prompts = []
    for _ in range(args.num_prompts):
        t = int(rng.integers(vocab))
        cyc = [t]
        while len(cyc) < args.cycle and nxt[cyc[-1]] != t:
            cyc.append(int(nxt[cyc[-1]]))
        prompts.append(cyc * args.repeats)
    # the copy says what it is (the bench reuses a checkpoint whose mla_checkpoint.json matches)
    made = json.loads((src / "mla_checkpoint.json").read_text()) if (src / "mla_checkpoint.json").is_file() else {}
    made.update(planted="successor", cycle=args.cycle, damp=args.damp, seed_plant=args.seed, planted_from=str(src))
    (out / "mla_checkpoint.json").write_text(json.dumps(made, indent=2) + "\n")
    dest = Path(args.prompts_out) if args.prompts_out else out / "prompts.json"
    dest.write_text(json.dumps(prompts) + "\n")
    print(f"wrote {out} (lm_head = embedding rows of pi^-1, output projections x {args.damp}) and {dest} "
          f"({args.num_prompts} prompts of {args.cycle} x {args.repeats} tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
