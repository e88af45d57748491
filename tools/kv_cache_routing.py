#!/usr/bin/env python
"""Is a large logits error of a rounded latent cache the cache's own error, or a MoE routing
near-tie that the rounding tips over? (issue 15: the Kimi-like f16 row at 5.3e-2)

transformers is the oracle here (f32 weights and arithmetic, no engine involved). The model of
tools/kv_dtype_accuracy.py (same config and seed, same prompts) runs each sequence's prompt
plus 24 greedy tokens of the f32 model in one forward, three ways:
  f32      as is;
  rounded  every cached latent row rounded as the cache stores it: kv_c after kv_a_layernorm and
           k_pe after RoPE, to f16 / bf16 (or int8 / fp8 with mla_export.formats.kv_formats' exact
           quantisation), which is what the engine's cache does to them;
  pinned   rounded, but every MoE router forced to the expert set the f32 run chose at that token
           (its weights still from its own scores).
Per model and format it prints, over the rows kv_dtype_accuracy measures (the last prompt
token and the decode steps): the worst and 90th-percentile logits error of `rounded` and
`pinned` against f32 (max |l - l32| / max |l32|), how many (row, layer) router choices differ
from f32's, and for the worst row the f32 router's margin between its k-th and (k+1)-th
expert (a near-tie is a margin far below the score change the rounding causes).
It also prints the worst unpinned error over the rows with no changed router choice at or
before them in their sequence: their error is the cache's own (a row after a changed choice can
inherit it through attention even when its own choices match).

    python tools/kv_cache_routing.py --configs kimi-like,v3-like --kv-dtypes f16,bf16,int8,fp8 --num-seqs 32

Needs torch + transformers (like the export). Precision: f32 throughout; the only rounding is the
cache format's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_dtype_accuracy import CONFIGS, SEEDS  # noqa: E402  (the same models and seeds)


def _round_rows(x, kv_dtype: str, part: str):
    """x (any shape, last axis = the kv_c or k_pe part of rows) as the cache stores it, in f32.
    int8/fp8 quantise kv_c by mla_export.formats.kv_formats in the shipped layout's groups (int8 4, fp8 1), or
    in G equal groups for "int8@G" / "fp8@G"; k_pe stays bf16."""
    import torch

    from mla_export.formats import kv_formats as kf
    base, _, groups = kv_dtype.partition("@")
    if base == "f16":
        return x.to(torch.float16).to(torch.float32)
    if base == "bf16" or part == "k_pe":
        return x.to(torch.bfloat16).to(torch.float32)
    g = int(groups) if groups else kf.scale_groups(base, x.shape[-1])  # default: the shipped layout's groups
    flat = x.detach().reshape(-1, x.shape[-1] // g).numpy().astype(np.float32)
    codes, scales = kf.quantise_rows(flat, base)
    return torch.from_numpy(kf.dequantise_rows(codes, scales).astype(np.float32)).reshape(x.shape)


class Patched:
    """Context: rounds the cached rows of a DeepseekV3 model to kv_dtype, optionally pins routing."""

    def __init__(self, model, kv_dtype: str | None, pin: list | None = None, record: list | None = None):
        self.model, self.kv, self.pin, self.record = model, kv_dtype, pin, record

    def __enter__(self):
        import torch

        v2 = self.model.config.model_type == "deepseek_v2"
        if v2:
            import transformers.models.deepseek_v2.modeling_deepseek_v2 as m
            self.rope_names = ("apply_rotary_emb",)
        else:
            import transformers.models.deepseek_v3.modeling_deepseek_v3 as m
            self.rope_names = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave")
        self.m = m
        self.saved = [getattr(m, n) for n in self.rope_names]
        self.hooks = []
        kv = self.kv
        # kv: a format name ("f16", "int8@4", ...) or a callable (x, part) -> x as stored (tools/kv_quant_sweep.py)
        rnd = kv if callable(kv) else (lambda x, part: _round_rows(x, kv, part))
        if kv is not None:
            def wrap(fn):
                def rope(q, k, *a, **kw):
                    q2, k2 = fn(q, k, *a, **kw)
                    return q2, rnd(k2, "k_pe").to(k2.dtype)  # k_pe as stored (after RoPE)
                return rope
            for n, fn in zip(self.rope_names, self.saved):
                setattr(m, n, wrap(fn))
            for layer in self.model.model.layers:
                self.hooks.append(layer.self_attn.kv_a_layernorm.register_forward_hook(
                    lambda mod, inp, out: rnd(out, "kv_c").to(out.dtype)))  # kv_c as stored
        routers = [layer.mlp.gate for layer in self.model.model.layers if hasattr(layer.mlp, "gate")]
        self.routers = routers
        self.orig_forward = [r.forward for r in routers]
        for li, r in enumerate(routers):
            def fwd(hidden, r=r, li=li, orig=r.forward):
                logits, weights, idx = orig(hidden)
                # the score the router ranks: softmax (V2 greedy) or sigmoid + bias (V3)
                probs = logits.float().softmax(dim=-1) if v2 else torch.sigmoid(logits.float())
                scores = probs if v2 else probs + r.e_score_correction_bias
                if self.record is not None:
                    self.record.append((li, idx.sort(dim=-1).values.clone(), scores.detach().clone()))
                if self.pin is not None:
                    idx = self.pin[li]
                    w = probs.gather(1, idx)
                    if getattr(r, "norm_topk_prob", False):
                        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
                    weights = w * r.routed_scaling_factor
                return logits, weights, idx
            r.forward = fwd
        return self

    def __exit__(self, *exc):
        for n, fn in zip(self.rope_names, self.saved):
            setattr(self.m, n, fn)
        for h in self.hooks:
            h.remove()
        for r, f in zip(self.routers, self.orig_forward):
            r.forward = f


def forward(model, tokens, kv=None, pin=None, record=None):
    import torch
    with torch.no_grad(), Patched(model, kv, pin, record):
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy().astype(np.float64)


def study(name: str, work: Path, kv_dtypes, prompt_len: int = 96, decode_steps: int = 24, num_seqs: int = 4,
          log=print) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from mla_export.checkpoint.presets import make_checkpoint
    model_type, overrides = CONFIGS[name]
    ckpt = make_checkpoint(work / name / "ckpt", model_type, seed=SEEDS[name], **overrides)
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    rng = np.random.default_rng(SEEDS[name])
    prompts = [rng.integers(2, vocab, prompt_len + 7 * (i % 8)).tolist() for i in range(num_seqs)]
    out = {}
    seqs = []
    for p in prompts:  # f32 greedy continuation (the teacher-forced tokens)
        toks = list(p)
        for _ in range(decode_steps):
            toks.append(int(np.argmax(forward(model, toks)[-1])))
        seqs.append((toks, len(p) - 1))
    for kv in kv_dtypes:
        rows = []
        for s, (toks, first) in enumerate(seqs):
            rec32: list = []
            l32 = forward(model, toks, record=rec32)
            pin = [idx for _, idx, _ in rec32]
            recq: list = []
            lq = forward(model, toks, kv=kv, record=recq)
            lp = forward(model, toks, kv=kv, pin=pin)
            # positions where some layer's router chose differently from f32's: rows at or after the
            # first of them can inherit the changed choice through attention (a row before it cannot)
            changed = [p for p in range(len(toks)) if any(not torch.equal(i32[p], iq[p])
                                                          for (_, i32, _), (_, iq, _) in zip(rec32, recq))]
            first_change = min(changed, default=len(toks))
            for pos in range(first, len(toks) - 1):
                ref = l32[pos]
                err = np.abs(lq[pos] - ref).max() / np.abs(ref).max()
                err_pin = np.abs(lp[pos] - ref).max() / np.abs(ref).max()
                flips = [li for (li, i32, _), (_, iq, _) in zip(rec32, recq) if not torch.equal(i32[pos], iq[pos])]
                # the f32 router's margin at the k-th expert of each flipped layer
                margins = []
                for li in flips:
                    sc = rec32[li][2][pos].sort(descending=True).values
                    k = rec32[li][1].shape[-1]
                    margins.append(float(sc[k - 1] - sc[k]))
                top2 = np.sort(ref)[-2:]
                rows.append(dict(seq=s, pos=pos, err=float(err), err_pinned=float(err_pin), flipped_layers=flips,
                                 flip_margins=margins, decisive=bool(top2[1] - top2[0] > 0.05),
                                 agree=bool(np.argmax(lq[pos]) == np.argmax(ref)),
                                 agree_pinned=bool(np.argmax(lp[pos]) == np.argmax(ref)),
                                 routing_clean=pos < first_change))
        errs = np.array([r["err"] for r in rows])
        pins = np.array([r["err_pinned"] for r in rows])
        worst = max(rows, key=lambda r: r["err"])
        n_flip = sum(len(r["flipped_layers"]) for r in rows)
        res = dict(rows=len(rows), worst=float(errs.max()), p90=float(np.percentile(errs, 90)),
                   worst_pinned=float(pins.max()), p90_pinned=float(np.percentile(pins, 90)),
                   router_flips=n_flip, decisive=sum(r["decisive"] for r in rows),
                   agree_decisive=sum(r["decisive"] and r["agree"] for r in rows),
                   agree_decisive_pinned=sum(r["decisive"] and r["agree_pinned"] for r in rows), rows_with_flips=sum(bool(r["flipped_layers"]) for r in rows),
                   worst_row=worst,
                   # rows whose own router choices all match f32's (earlier tokens' may not)
                   worst_without_flip=float(max([r["err"] for r in rows if not r["flipped_layers"]], default=0)),
                   # rows with no changed router choice at or before them in their sequence: unpinned,
                   # their error is the cache's own
                   clean_rows=sum(r["routing_clean"] for r in rows),
                   worst_clean=float(max([r["err"] for r in rows if r["routing_clean"]], default=0)))
        out[kv] = res
        log(f"{name:<10} {kv:<5} rounded: worst {res['worst']:.2e} p90 {res['p90']:.2e} | routing pinned to f32's: "
            f"worst {res['worst_pinned']:.2e} p90 {res['p90_pinned']:.2e} | greedy = f32 on decisive rows "
            f"{res['agree_decisive']}/{res['decisive']} (pinned {res['agree_decisive_pinned']}) | router choices changed: {n_flip} "
            f"(in {res['rows_with_flips']}/{len(rows)} rows); worst row seq {worst['seq']} pos {worst['pos']} "
            f"flipped layers {worst['flipped_layers']} f32 margins {[round(m, 6) for m in worst['flip_margins']]}; "
            f"worst row without a flip {res['worst_without_flip']:.2e}; worst of the {res['clean_rows']} rows with no "
            f"changed choice up to them {res['worst_clean']:.2e}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="v3-like,kimi-like")
    ap.add_argument("--kv-dtypes", default="f16,bf16,int8,fp8")
    ap.add_argument("--num-seqs", type=int, default=4, help="prompts (seed: the checkpoint's, as kv_dtype_accuracy)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="kv_routing_") as tmp:
        for name in args.configs.split(","):
            results[name] = study(name, Path(tmp), args.kv_dtypes.split(","), num_seqs=args.num_seqs)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
