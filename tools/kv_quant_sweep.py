#!/usr/bin/env python
"""Which latent-cache layouts keep f32's greedy token on every decisive step? (issue 15: fp8)

The oracle of tools/kv_cache_routing.py (transformers, f32 weights and arithmetic, only the
cached rows rounded as a layout stores them, optionally every MoE router pinned to the f32
run's choices) over many more prompts than the engine tool, for the real formats and for
layouts that exist only here, so that a layout is chosen on evidence before kernels are built:

  f16, bf16                  the 16-bit formats (kv_c and k_pe)
  int8@G, fp8@G              G equal groups of r/G latent values per f32 scale, max/127 or max/448
                             (int8@4 and fp8@1 are the shipped int8 and fp8 rows; at r = 512,
                             fp8@4 is DeepSeek's FlashMLA entry: 4 scales per 128-value tile)
  fp8@G/pow2                 scale rounded up to a power of two (DeepSeek V3.2's ue8m0 scales)
  fp8@G/clip=C               scale C*max/448 with C < 1: the largest values saturate at 448
  fp8@G/had                  kv_c rotated by an orthonormal Hadamard matrix before quantising
                             (a graph would fold the inverse into W_uk / W_uv)
  e5m2@G                     float8_e5m2 codes (2 mantissa bits), max/57344
  intB@G                     B-bit integer codes (B = 4..12), max/(2^(B-1)-1)
  fmM                        a float with M stored mantissa bits and unbounded exponent
                             (e4m3 is fm3, bf16 fm7, f16 fm10): the precision curve
  A|B                        kv_c stored as A, k_pe as B (f32 = exact); without "|", k_pe is
                             bf16 for the 8-bit layouts and the same 16-bit format otherwise

Per model and layout it prints the relative RMS error of the stored kv_c values
(||x^ - x|| / ||x|| over every cached row), the logits error against f32 (median / worst),
greedy agreement on decisive steps (f32 top-2 margin > 0.05) unpinned and with routing pinned,
and the f32 margins of the decisive steps that flipped.

    python tools/kv_quant_sweep.py --configs kimi-like --num-seqs 32 \\
        --layouts f16,int8@4,fp8@1,fp8@4,fp8@1/pow2,fm4,fm5

Seeds (printed): the checkpoint's from tools/kv_dtype_accuracy.py (or --model-seeds), the prompts'
from --prompt-seed (default: the checkpoint seed, as the engine tool). Needs torch +
transformers. Precision: f32 throughout; the only rounding is the layout's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_cache_routing import forward  # noqa: E402
from kv_dtype_accuracy import CONFIGS, MARGIN, SEEDS  # noqa: E402


def _hadamard(n: int) -> np.ndarray:
    if n & (n - 1):
        raise SystemExit(f"/had needs a power-of-two group size, got {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def _float_m(x: np.ndarray, m: int) -> np.ndarray:
    """x rounded to M stored mantissa bits (round half to even), exponent unbounded."""
    mant, exp = np.frexp(x)  # x = mant * 2^exp, 0.5 <= |mant| < 1
    return np.ldexp(np.rint(mant * 2.0 ** (m + 1)) / 2.0 ** (m + 1), exp)


def _grouped(x: np.ndarray, layout: str) -> np.ndarray:
    """kv_c rows x [N, r] (float64) through an 8-bit-or-so grouped layout, back in float64."""
    import ml_dtypes

    base, _, opt = layout.partition("/")
    kind, _, g = base.partition("@")
    n, r = x.shape
    g = int(g or 1)
    if r % g:
        raise SystemExit(f"{layout}: r = {r} is not a multiple of {g} groups")
    h = _hadamard(r // g) if opt == "had" else None
    xs = x.reshape(n * g, r // g)
    if h is not None:
        xs = xs @ h
    xs = xs.astype(np.float32)
    if kind == "fp8":
        top, code = 448.0, ml_dtypes.float8_e4m3fn
    elif kind == "e5m2":
        top, code = 57344.0, ml_dtypes.float8_e5m2
    elif kind.startswith("int"):
        top, code = float(2 ** (int(kind[3:]) - 1) - 1), None
    else:
        raise SystemExit(f"unknown layout {layout!r}")
    amax = np.abs(xs).max(axis=1, keepdims=True)
    scale = (amax / np.float32(top)).astype(np.float32)
    if opt == "pow2":
        scale = np.where(scale > 0, 2.0 ** np.ceil(np.log2(np.where(scale > 0, scale, 1))), 0).astype(np.float32)
    elif opt.startswith("clip="):
        scale = (scale * np.float32(opt[5:])).astype(np.float32)
    elif opt not in ("", "had"):
        raise SystemExit(f"unknown option in {layout!r}")
    y = np.clip(xs / np.where(scale > 0, scale, 1), -top, top)
    q = np.rint(y) if code is None else y.astype(code).astype(np.float64)
    out = q.astype(np.float64) * scale
    if h is not None:
        out = out @ h.T
    return out.reshape(n, r)


def _store(x: np.ndarray, fmt: str) -> np.ndarray:
    """Rows x [N, width] (float64) as format fmt stores them."""
    import ml_dtypes

    if fmt == "f32":
        return x.astype(np.float32).astype(np.float64)
    if fmt == "f16":
        return x.astype(np.float16).astype(np.float64)
    if fmt == "bf16":
        return x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    if fmt.startswith("fm"):
        return _float_m(x, int(fmt[2:]))
    return _grouped(x, fmt)


class Rounder:
    """The callable kv_cache_routing.Patched applies to kv_c and k_pe; accumulates kv_c's error."""

    def __init__(self, layout: str):
        kvc, _, kpe = layout.partition("|")
        self.kvc = kvc
        self.kpe = kpe or (kvc if kvc in ("f16", "bf16", "f32") else "bf16")
        self.err2 = self.ref2 = 0.0

    def __call__(self, t, part):
        import torch

        x = t.detach().reshape(-1, t.shape[-1]).double().numpy()
        y = _store(x, self.kvc if part == "kv_c" else self.kpe)
        if part == "kv_c":
            self.err2 += float(((y - x) ** 2).sum())
            self.ref2 += float((x ** 2).sum())
        return torch.from_numpy(y.astype(np.float32)).reshape(t.shape)


def sweep(name: str, work: Path, layouts, num_seqs: int = 16, prompt_len: int = 96, decode_steps: int = 24,
          model_seed: int | None = None, prompt_seed: int | None = None, pinned: bool = True, log=print) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from mla_export.checkpoint.presets import make_checkpoint

    model_type, overrides = CONFIGS[name]
    model_seed = SEEDS[name] if model_seed is None else model_seed
    prompt_seed = model_seed if prompt_seed is None else prompt_seed
    ckpt = make_checkpoint(work / f"{name}-{model_seed}", model_type, seed=model_seed, **overrides)
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    rng = np.random.default_rng(prompt_seed)
    prompts = [rng.integers(2, vocab, prompt_len + 7 * (i % 8)).tolist() for i in range(num_seqs)]
    seqs, refs = [], []
    for p in prompts:  # f32 greedy continuation: the teacher-forced tokens
        toks = list(p)
        for _ in range(decode_steps):
            toks.append(int(np.argmax(forward(model, toks)[-1])))
        rec: list = []
        refs.append((forward(model, toks, record=rec), [idx for _, idx, _ in rec]))
        seqs.append((toks, len(p) - 1))
    log(f"{name}: model seed {model_seed}, prompt seed {prompt_seed}, {num_seqs} prompts of "
        f"{prompt_len}-{prompt_len + 7 * min(num_seqs - 1, 7)} tokens + {decode_steps} greedy steps")
    out = {}
    for layout in layouts:
        rnd = Rounder(layout)
        errs, flips, flips_pinned, agree_all = [], [], [], 0
        n_decisive = 0
        for (toks, first), (l32, pin) in zip(seqs, refs):
            lq = forward(model, toks, kv=rnd)
            lp = forward(model, toks, kv=rnd, pin=pin) if pinned else lq
            for pos in range(first, len(toks) - 1):
                ref = l32[pos]
                errs.append(np.abs(lq[pos] - ref).max() / np.abs(ref).max())
                top2 = np.sort(ref)[-2:]
                margin = float(top2[1] - top2[0])
                ok = np.argmax(lq[pos]) == np.argmax(ref)
                agree_all += bool(ok)
                if margin > MARGIN:
                    n_decisive += 1
                    if not ok:
                        flips.append(round(margin, 4))
                    if np.argmax(lp[pos]) != np.argmax(ref):
                        flips_pinned.append(round(margin, 4))
        errs = np.array(errs)
        res = dict(kv_c_rel_rms=math.sqrt(rnd.err2 / rnd.ref2), median=float(np.median(errs)),
                   p90=float(np.percentile(errs, 90)), worst=float(errs.max()), rows=len(errs), agree_all=agree_all,
                   decisive=n_decisive, flips=sorted(flips), flips_pinned=sorted(flips_pinned) if pinned else None)
        out[layout] = res
        log(f"  {layout:<16} kv_c rel rms {res['kv_c_rel_rms']:.2e}  logits err median {res['median']:.1e} "
            f"worst {res['worst']:.1e}  decisive {n_decisive - len(flips)}/{n_decisive}"
            + (f" (pinned {n_decisive - len(flips_pinned)})" if pinned else "")
            + f"  all {agree_all}/{len(errs)}  flipped margins {sorted(flips)}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--layouts", default="f16,bf16,int8@1,int8@4,fp8@1,fp8@4,fp8@1/pow2,fm4,fm5")
    ap.add_argument("--num-seqs", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--decode-steps", type=int, default=24)
    ap.add_argument("--model-seeds", help="comma list of checkpoint seeds (default: each config's)")
    ap.add_argument("--prompt-seed", type=int)
    ap.add_argument("--no-pinned", action="store_true", help="skip the pinned-routing forward (half the time)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="kv_sweep_") as tmp:
        for name in args.configs.split(","):
            seeds = [int(s) for s in args.model_seeds.split(",")] if args.model_seeds else [None]
            for seed in seeds:
                key = name if seed is None else f"{name}@{seed}"
                results[key] = sweep(name, Path(tmp), args.layouts.split(","), args.num_seqs, args.prompt_len,
                                     args.decode_steps, seed, args.prompt_seed, not args.no_pinned)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
