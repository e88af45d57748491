#!/usr/bin/env python
"""Write a random-weight DeepSeek checkpoint at real dimensions, tensor by tensor (no torch, no hub).

    python tools/make_checkpoint.py /work/ckpt/v2lite-3l --layers 3            # 1 dense + 2 MoE, 3.3 GB
    python tools/make_checkpoint.py /work/ckpt/v2lite --layers 27              # the full V2-Lite, 31.4 GB
    python tools/make_checkpoint.py /work/ckpt/v3-4l --shape v3 --layers 4     # 3 dense + 1 MoE, 30.2 GB
    python tools/make_checkpoint.py /work/ckpt/v3-mtp --shape v3 --layers 4 --mtp   # + V3's MTP layer

The directory holds config.json (the hub model's config, num_hidden_layers and
first_k_dense_replace adapted), sharded bf16 safetensors with model.safetensors.index.json, a
byte-level BPE tokenizer of the full vocabulary, and generation_config.json: transformers,
`mla-export export` and llama.cpp's converter all take it. Peak memory is one chunk of one tensor
(~100 MB); the time goes into drawing the random numbers (~1-2 min per 10 GB here).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source tree without installing

from mla_export.bench.checkpoint import (  # noqa: E402
    SHAPES, CheckpointWriteError, checkpoint_config, size_bytes, write_checkpoint)


def _sizes() -> str:
    rows = []
    for shape, layers in (("v2lite", 3), ("v2lite", 27), ("v3", 4), ("v3", 61)):
        c = checkpoint_config(shape, layers)
        rows.append(f"  --shape {shape:6s} --layers {layers:2d}: {c['first_k_dense_replace']} dense + "
                    f"{layers - c['first_k_dense_replace']} MoE layers, {size_bytes(c) / 1e9:7.1f} GB bf16")
    return "sizes (bf16; f32 doubles them):\n" + "\n".join(rows) + (
        "\n  a V3 MoE layer alone is 257 experts x 3 x 7168 x 2048 = 11.3B parameters (22.6 GB bf16);"
        "\n  the embedding and lm_head are 3.7 GB together.")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=_sizes(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--shape", choices=list(SHAPES), default="v2lite",
                   help="; ".join(f"{k}: {v.about}" for k, v in SHAPES.items()))
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the real model's)")
    p.add_argument("--dense-layers", type=int, default=None,
                   help="dense (non-MoE) first layers (default: the real model's, at most layers - 1)")
    p.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", type=float, default=4.0, help="largest shard, GiB (default 4)")
    p.add_argument("--mtp", action="store_true",
                   help="add DeepSeek-V3's multi-token-prediction layer (model.layers.<layers>.*: enorm, hnorm, "
                        "eh_proj, a MoE decoder layer, shared_head), num_nextn_predict_layers 1 (--shape v3 only)")
    p.add_argument("--no-tokenizer", action="store_true")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="print the size and exit")
    a = p.parse_args(argv)
    try:
        cfg = checkpoint_config(a.shape, a.layers, a.dense_layers, a.mtp)
        total = size_bytes(cfg, a.dtype)
        print(f"{a.shape}: {cfg['num_hidden_layers']} layers ({cfg['first_k_dense_replace']} dense), "
              f"{total / 1e9:.2f} GB {a.dtype} -> {a.out_dir}", flush=True)
        if a.dry_run:
            return 0
        t0, last = time.time(), [0.0]

        def progress(done, need):
            if time.time() - last[0] > 10 or done == need:
                last[0] = time.time()
                print(f"  {done / 1e9:6.2f} / {need / 1e9:.2f} GB ({time.time() - t0:.0f} s)", flush=True)

        write_checkpoint(a.out_dir, a.shape, a.layers, seed=a.seed, dtype=a.dtype, dense_layers=a.dense_layers,
                         max_shard_bytes=int(a.shard_size * 2**30), tokenizer=not a.no_tokenizer,
                         overwrite=a.overwrite, progress=progress, mtp=a.mtp)
    except CheckpointWriteError as e:
        print(f"make_checkpoint: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out_dir} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
