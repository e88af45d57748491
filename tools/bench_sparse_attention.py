"""DeepSeek Sparse Attention vs dense attention per layer at DeepSeek-V3.2's real attention
dimensions (128 heads, kv_lora 512 + rope 64, nope 128, v 128; indexer 64 heads x 128, top-k 2048),
one decode token at several context lengths, and optionally a prefill, through the ops as the
runtime runs them (OpenVINO one-op models, bf16 caches bound as bytes, compute "bf16" as under the
runtime's bf16 hint).

Side by side in one process, alternating A B A B, medians of the rounds:
  dense   MlaPagedAttention over every cached position
  sparse  MlaIndexerTopK over the indexer-key cache, then MlaPagedAttention over the 2048 selected
and the two parts of sparse alone (indexer, attention over the selection). Random weights and
caches; the indexer's selection of random keys is as expensive as a real one.

  python tools/bench_sparse_attention.py --contexts 4096 16384 65536 131072 --threads 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import ml_dtypes
import numpy as np

from mla_export.ops import kernel_config, kernels
from mla_export.formats import kv_formats

BF16 = ml_dtypes.bfloat16
H, R, DR, DN, DV = 128, 512, 64, 128, 128
HI, D, TOPK = 64, 128, 2048


def _cache(rng, positions: int, width: int, block_size: int, dtype: str):
    """A paged cache holding `positions` rows in shuffled blocks, and its block table."""
    blocks = -(-positions // block_size)
    table = rng.permutation(blocks).astype(np.int32)[None, :]
    rows = rng.standard_normal((blocks * block_size, width), dtype=np.float32)
    if dtype == "bf16":
        cache = rows.astype(BF16).reshape(blocks, block_size, width)
    else:
        from mla_export.formats.kv_formats import encode_rows

        cache = encode_rows(rows, dtype, width if width == D else R).reshape(blocks, block_size, -1)
    return cache, table


def _time(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def run(contexts, threads: int, rounds: int, block_size: int, kv_dtype: str, compute: str) -> list[dict]:
    rng = np.random.default_rng(0)
    w_uk = (rng.standard_normal((H, DN, R), dtype=np.float32) * 0.05).astype(BF16)
    w_uv = (rng.standard_normal((H, R, DV), dtype=np.float32) * 0.05).astype(BF16)
    q_nope = rng.standard_normal((1, H, DN), dtype=np.float32)
    q_pe = rng.standard_normal((1, H, DR), dtype=np.float32)
    q_idx = rng.standard_normal((1, HI, D), dtype=np.float32)
    w_idx = rng.standard_normal((1, HI), dtype=np.float32) * HI ** -0.5
    kv = None if kv_dtype == "bf16" else kv_dtype
    results = []
    for n in contexts:
        latent, table = _cache(rng, n, R + DR, block_size, kv_dtype)
        index, _ = _cache(np.random.default_rng(1), n, D, block_size, kv_dtype)
        meta = (np.array([0, 1], np.int32), np.array([n], np.int32), table)
        scale = (DN + DR) ** -0.5

        def dense():
            return kernels.paged_attention(q_nope, q_pe, latent, w_uk, w_uv, *meta, scale, "absorbed", kv,
                                           num_threads=threads, compute=compute)

        def indexer():
            return kernels.indexer_topk(q_idx, w_idx, index, *meta, TOPK, kv, num_threads=threads, compute=compute)

        picked = indexer()

        def attend():
            return kernels.paged_attention(q_nope, q_pe, latent, w_uk, w_uv, *meta, scale, "absorbed", kv,
                                           num_threads=threads, compute=compute, topk_indices=picked)

        def sparse():
            return kernels.paged_attention(q_nope, q_pe, latent, w_uk, w_uv, *meta, scale, "absorbed", kv,
                                           num_threads=threads, compute=compute, topk_indices=indexer())

        for f in (dense, sparse, indexer, attend):  # compile and warm up
            f()
        times = {"dense": [], "sparse": [], "indexer": [], "attention_over_selection": []}
        for _ in range(rounds):  # A B A B: both see the same neighbours on the host
            times["dense"] += _time(dense, 1)
            times["sparse"] += _time(sparse, 1)
            times["indexer"] += _time(indexer, 1)
            times["attention_over_selection"] += _time(attend, 1)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        row = dict(context=n, **{f"{k}_ms": round(v, 3) for k, v in med.items()},
                   dense_over_sparse=round(med["dense"] / med["sparse"], 2))
        print(json.dumps(row), flush=True)
        results.append(row)
        del latent, index
    return results


def prefill(tokens: int, threads: int, rounds: int, block_size: int, kv_dtype: str, compute: str,
            forms=("auto", "absorbed", "expanded")) -> dict:
    """One layer's prefill of a `tokens`-token prompt: dense (form chosen by cost) against sparse
    (indexer, then attention over each token's selection in each form), alternated."""
    rng = np.random.default_rng(2)
    w_uk = (rng.standard_normal((H, DN, R), dtype=np.float32) * 0.05).astype(BF16)
    w_uv = (rng.standard_normal((H, R, DV), dtype=np.float32) * 0.05).astype(BF16)
    q_nope = rng.standard_normal((tokens, H, DN), dtype=np.float32)
    q_pe = rng.standard_normal((tokens, H, DR), dtype=np.float32)
    q_idx = rng.standard_normal((tokens, HI, D), dtype=np.float32)
    w_idx = rng.standard_normal((tokens, HI), dtype=np.float32) * HI ** -0.5
    kv = None if kv_dtype == "bf16" else kv_dtype
    latent, table = _cache(rng, tokens, R + DR, block_size, kv_dtype)
    index, _ = _cache(np.random.default_rng(1), tokens, D, block_size, kv_dtype)
    meta = (np.array([0, tokens], np.int32), np.array([tokens], np.int32), table)
    scale = (DN + DR) ** -0.5
    picked = kernels.indexer_topk(q_idx, w_idx, index, *meta, TOPK, kv, num_threads=threads, compute=compute)
    cases = {
        "dense": lambda: kernels.paged_attention(q_nope, q_pe, latent, w_uk, w_uv, *meta, scale, "auto", kv,
                                                 num_threads=threads, compute=compute),
        "indexer": lambda: kernels.indexer_topk(q_idx, w_idx, index, *meta, TOPK, kv, num_threads=threads,
                                                compute=compute),
    }
    for form in forms:
        cases[f"selection_{form}"] = (lambda f=form: kernels.paged_attention(
            q_nope, q_pe, latent, w_uk, w_uv, *meta, scale, f, kv, num_threads=threads, compute=compute,
            topk_indices=picked))
    times = {k: [] for k in cases}
    for _ in range(rounds):
        for k, fn in cases.items():
            times[k] += _time(fn, 1)
    row = dict(prefill_tokens=tokens, **{f"{k}_s": round(statistics.median(v), 3) for k, v in times.items()})
    print(json.dumps(row), flush=True)
    return row


def svg_plot(facts: dict) -> str:
    """The decode rows as an SVG line plot (no plotting library): time per layer over context."""
    rows = [r for r in facts["rows"] if "context" in r]
    series = [("dense_ms", "dense attention", "#c0392b"), ("sparse_ms", "sparse: indexer + attention", "#2471a3"),
              ("indexer_ms", "indexer alone", "#7fb3d5")]
    w, h, left, bottom, top, right = 640, 380, 60, 50, 40, 190
    xs = [math.log2(r["context"]) for r in rows]
    ymax = max(r[k] for r in rows for k, _, _ in series) * 1.1
    x0, x1 = min(xs), max(xs)

    def px(x):
        return left + (x - x0) / max(x1 - x0, 1e-9) * (w - left - right)

    def py(y):
        return h - bottom - y / ymax * (h - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="13">Decode, one token, one layer at DeepSeek-V3.2 attention dims '
           f'(ms, median)</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>']
    for r, x in zip(rows, xs):
        label = f'{r["context"] // 1024}k'
        out.append(f'<text x="{px(x):.1f}" y="{h - bottom + 16}" text-anchor="middle">{label}</text>')
    step = 10 ** math.floor(math.log10(ymax / 4)) if ymax > 0 else 1
    step *= 2 if ymax / step > 10 else 1
    y = 0.0
    while y <= ymax:
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        out.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{w - right}" y2="{py(y):.1f}" stroke="#ddd"/>')
        y += step
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">context (tokens in the '
               f'cache)</text>')
    for i, (key, label, color) in enumerate(series):
        pts = " ".join(f"{px(x):.1f},{py(r[key]):.1f}" for r, x in zip(rows, xs))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(r[key]):.1f}" r="3" fill="{color}"/>' for r, x in zip(rows, xs)]
        out.append(f'<line x1="{w - right + 10}" y1="{top + 10 + 18 * i}" x2="{w - right + 30}" '
                   f'y2="{top + 10 + 18 * i}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{w - right + 34}" y="{top + 14 + 18 * i}">{label}</text>')
    note = f'{facts["cpu"]}, {facts["threads"]} threads, {facts["kv_dtype"]} caches, compute {facts["compute"]}'
    out.append(f'<text x="{left}" y="{top - 6}" font-size="10" fill="#555">{note}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="*", default=[4096, 16384, 65536, 131072])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-dtype", choices=kv_formats.KV_DTYPES, default="bf16")
    ap.add_argument("--compute", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--prefill", type=int, nargs="*", default=[], help="prompt lengths of one-layer prefills to time")
    ap.add_argument("--prefill-rounds", type=int, default=1)
    ap.add_argument("--prefill-forms", nargs="+", default=["auto", "absorbed", "expanded"],
                    choices=["auto", "absorbed", "expanded"], help="attention forms over the selection to time")
    ap.add_argument("--json", help="write the rows and the machine here")
    ap.add_argument("--svg", help="plot the decode rows here")
    args = ap.parse_args(argv)
    rows = run(args.contexts, args.threads, args.rounds, args.block_size, args.kv_dtype, args.compute)
    rows += [prefill(n, args.threads, args.prefill_rounds, args.block_size, args.kv_dtype, args.compute,
                     args.prefill_forms) for n in args.prefill]
    if args.json:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor())
        facts = dict(cpu=cpu, isa=kernel_config.config().isa, threads=args.threads, kv_dtype=args.kv_dtype,
                     compute=args.compute, block_size=args.block_size,
                     dims=dict(heads=H, kv_lora_rank=R, rope=DR, nope=DN, v=DV, index_heads=HI, index_dim=D,
                               topk=TOPK), rows=rows)
        with open(args.json, "w") as f:
            json.dump(facts, f, indent=1)
    if args.svg:
        if not args.json:
            ap.error("--svg needs --json (the plot names the machine)")
        with open(args.svg, "w") as f:
            f.write(svg_plot(facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
