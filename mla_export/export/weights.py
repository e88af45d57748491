"""Reading a checkpoint's safetensors weights one tensor at a time.

`CheckpointReader` maps every tensor name to its shard (`model.safetensors.index.json`, or all
`*.safetensors` files of the directory) and opens shards lazily with `safe_open`, so the exporter
holds only the tensors of the layer it is building. Tensors come back as float32 numpy arrays
(bf16/f16 shards are widened through torch, which reads every safetensors dtype); the caller says
which shape it expects and gets a `WeightError` naming the tensor when the file disagrees.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["CheckpointReader", "WeightError"]

_FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}


class WeightError(ValueError):
    """A tensor is missing, has the wrong shape, or holds a dtype the exporter cannot take."""


class CheckpointReader:
    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self._where: dict[str, Path] = {}
        self._open: dict[Path, object] = {}
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError) as e:
                raise WeightError(f"{index}: not a valid safetensors index ({e})") from e
            for name, file in weight_map.items():
                self._where[name] = self.model_dir / file
            missing = sorted({p.name for p in self._where.values() if not p.is_file()})
            if missing:
                raise WeightError(f"{index} names shard(s) that do not exist: {', '.join(missing)}")
        else:
            shards = sorted(self.model_dir.glob("*.safetensors"))
            if not shards:
                raise WeightError(f"{self.model_dir}: no *.safetensors weights found "
                                  "(.bin / .pt checkpoints are not supported: save with safe_serialization)")
            for shard in shards:
                for name in self._handle(shard).keys():
                    self._where[name] = shard

    def _handle(self, path: Path):
        if path not in self._open:
            from safetensors import safe_open

            try:
                self._open[path] = safe_open(str(path), framework="pt")
            except Exception as e:  # safetensors raises its own error types for broken headers
                raise WeightError(f"{path}: not a readable safetensors file ({e})") from e
        return self._open[path]

    def names(self) -> list[str]:
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def _slice(self, name: str):
        if name not in self._where:
            raise WeightError(f"tensor {name!r} is missing from the checkpoint in {self.model_dir}")
        return self._handle(self._where[name]).get_slice(name)

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The tensor as a float32 numpy array, checked against `shape` when given."""
        sl = self._slice(name)
        dtype, got = sl.get_dtype(), tuple(sl.get_shape())
        if dtype not in _FLOAT_DTYPES:
            raise WeightError(f"tensor {name!r} has dtype {dtype}; only F32/F16/BF16 weights are supported "
                              "(dequantize FP8/int checkpoints first)")
        if shape is not None and got != tuple(shape):
            raise WeightError(f"tensor {name!r} has shape {list(got)}, expected {list(shape)} from config.json")
        t = self._handle(self._where[name]).get_tensor(name)
        arr = t.float().numpy()
        if not np.isfinite(arr).all():
            raise WeightError(f"tensor {name!r} holds NaN or Inf values")
        return np.ascontiguousarray(arr, dtype=np.float32)

    def close(self) -> None:
        self._open.clear()
