"""Write a float checkpoint as DeepSeek ships its FP8 ones (numpy only): every projection weight
(attention, dense MLP, shared and routed experts) as float8_e4m3fn codes with a float32
`weight_scale_inv` per block of `block` values (amax / 448 per block, as DeepSeek's own
quantization), everything else (embedding, lm_head, norms, router) as it was, and config.json's
`quantization_config` {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
weight_block_size}. Shard by shard, so a real-dimension checkpoint converts in one shard's memory.

    python -m mla_export.checkpoint.fp8 SRC_DIR OUT_DIR [--block 128 128]

What it is for: FP8 test checkpoints (the hub's FP8 releases cannot be fetched here), read back by
`CheckpointReader` exactly as an official DeepSeek-V3 / Kimi K2 release is read.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np

from .writer import save_safetensors
from .reader import FP8_SCALE_SUFFIX, SafetensorsFile

__all__ = ["quantize_fp8_blocks", "write_fp8_checkpoint", "FP8_MAX"]

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
# DeepSeek's FP8 releases quantize exactly the linear layers' weights (not the router `mlp.gate`)
_QUANTIZED = re.compile(r"\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|gate_proj|up_proj|down_proj)"
                        r"\.weight$")


def quantize_fp8_blocks(w: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 codes [R, C], scale_inv [ceil(R / br), ceil(C / bc)] f32) with w ~= codes * scale_inv."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    br, bc = block
    nr, nc = -(-rows // br), -(-cols // bc)
    scale = np.empty((nr, nc), np.float32)
    codes = np.empty(w.shape, ml_dtypes.float8_e4m3fn)
    for i in range(nr):
        for j in range(nc):
            tile = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            s = np.float32(np.abs(tile).max() / FP8_MAX) or np.float32(1.0)  # an all-zero block keeps scale 1
            scale[i, j] = s
            codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (tile / s).astype(ml_dtypes.float8_e4m3fn)
    return codes, scale


def write_fp8_checkpoint(src, out, block: tuple[int, int] = (128, 128)) -> Path:
    src, out = Path(src), Path(out)
    if any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in block) or len(block) != 2:
        raise ValueError(f"block must be two positive integers, got {block!r}")
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("quantization_config"):
        raise ValueError(f"{src} is already quantized ({cfg['quantization_config']})")
    out.mkdir(parents=True, exist_ok=True)
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{src}: no *.safetensors files")
    weight_map = {}
    for shard in shards:
        f = SafetensorsFile(shard)
        tensors = {}
        for name in f.entries:
            arr = f.array(name)
            if _QUANTIZED.search(name) and arr.ndim == 2:
                tensors[name], tensors[name + FP8_SCALE_SUFFIX] = quantize_fp8_blocks(arr.astype(np.float32), block)
            else:
                tensors[name] = arr
        f.close()
        save_safetensors(out / shard.name, tensors)
        weight_map.update({name: shard.name for name in tensors})
    if len(shards) > 1 or (src / "model.safetensors.index.json").exists():
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                                                     indent=2) + "\n")
    cfg["quantization_config"] = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
                                      weight_block_size=list(block))
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for extra in src.iterdir():  # tokenizer, generation config: as they are
        if extra.is_file() and extra.suffix != ".safetensors" and extra.name not in (
                "config.json", "model.safetensors.index.json"):
            shutil.copy2(extra, out / extra.name)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--block", type=int, nargs=2, default=[128, 128], metavar=("ROWS", "COLS"))
    a = p.parse_args(argv)
    print(write_fp8_checkpoint(a.src, a.out, tuple(a.block)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
