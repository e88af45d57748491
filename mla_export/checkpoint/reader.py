"""Reading a checkpoint's safetensors weights one tensor at a time, without torch.

`CheckpointReader` maps every tensor name to its shard (`model.safetensors.index.json`, or all
`*.safetensors` files of the directory). A shard is its 8-byte header length, a JSON header (name ->
dtype, shape, byte offsets) and the raw little-endian tensor bytes; the reader parses the header
itself and reads a tensor's bytes only when asked for, into memory of its own (not a map of the
file: mapped pages would count in the exporter's resident set until the end), so the exporter
holds only the tensors of the layer it is building. bf16 comes through `ml_dtypes`, so no torch is needed. Tensors come back as
float32 numpy arrays; the caller says which shape it expects and gets a `WeightError` naming the
tensor when the file disagrees.

FP8 checkpoints as DeepSeek (V3, R1, V3.1, V3.2) and Kimi K2 ship them: a projection's `weight`
holds float8_e4m3fn codes and `weight_scale_inv` one float32 multiplier per block of
`weight_block_size` (128 x 128) values; `get` returns codes x multiplier, block by block, in
float32, one tensor at a time (no bf16 copy on disk, no more memory than a bf16 tensor's read).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

__all__ = ["CheckpointReader", "WeightError", "SafetensorsFile", "FP8_SCALE_SUFFIX", "dequantize_fp8_blocks"]

# safetensors dtype names -> numpy dtypes (little-endian, as the format stores them)
_DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
           "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
           "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
           "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2)}
_FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}
_FP8_DTYPES = {"F8_E4M3"}  # DeepSeek's block-scaled weights (quantization_config.fmt: e4m3)
FP8_SCALE_SUFFIX = "_scale_inv"  # `x.weight` -> `x.weight_scale_inv`
_MAX_HEADER = 256 << 20  # the format's own reference implementation refuses headers over 100 MB


class WeightError(ValueError):
    """A tensor is missing, has the wrong shape, or holds a dtype the exporter cannot take."""


class SafetensorsFile:
    """One .safetensors file: its parsed header and an open handle to read tensors from."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = self.path.stat().st_size
                raw = f.read(8)
                if len(raw) != 8:
                    raise ValueError("shorter than the 8-byte header length")
                (n,) = struct.unpack("<Q", raw)
                if n > min(size - 8, _MAX_HEADER):
                    raise ValueError(f"header length {n} does not fit the file ({size} bytes)")
                header = json.loads(f.read(n))
                if not isinstance(header, dict):
                    raise ValueError("header is not a JSON object")
            self._file = open(self.path, "rb")
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise WeightError(f"{self.path}: not a readable safetensors file ({e})") from e
        self._start = 8 + n
        self._data_size = size - self._start
        self.metadata = header.pop("__metadata__", None)  # e.g. the random-weights mark (checkpoint/writer.py)
        self.entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            try:
                dtype, shape = info["dtype"], tuple(int(d) for d in info["shape"])
                begin, end = (int(o) for o in info["data_offsets"])
            except (KeyError, TypeError, ValueError) as e:
                raise WeightError(f"{self.path}: header entry {name!r} is malformed ({e})") from e
            if dtype in _DTYPES:
                want = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
                if any(d < 0 for d in shape) or not 0 <= begin <= end <= self._data_size or end - begin != want:
                    raise WeightError(f"{self.path}: tensor {name!r} ({dtype} {list(shape)}) has byte offsets "
                                      f"[{begin}, {end}) that do not match its size or the file")
            self.entries[name] = (dtype, shape, begin, end)

    def dtype(self, name: str) -> str:
        return self.entries[name][0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][1]

    def array(self, name: str) -> np.ndarray:
        """The tensor in its stored dtype, read from the file into a new array."""
        dtype, shape, begin, end = self.entries[name]
        out = np.empty(shape, dtype=_DTYPES[dtype])
        view = memoryview(out.reshape(-1).view(np.uint8))
        self._file.seek(self._start + begin)
        done = 0
        while done < end - begin:
            n = self._file.readinto(view[done:])
            if not n:
                raise WeightError(f"{self.path}: tensor {name!r} is cut short (the file ends at its byte {done})")
            done += n
        return out

    def close(self) -> None:
        self._file.close()


def _fp8_scales(scale_inv: np.ndarray, shape: tuple[int, ...], block: tuple[int, int], name: str) -> np.ndarray:
    """scale_inv as float32 once checked: one finite, positive scale per block of the weight's shape."""
    rows, cols = shape
    br, bc = block
    want = (-(-rows // br), -(-cols // bc))
    if scale_inv.shape != want:
        raise WeightError(f"tensor {name + FP8_SCALE_SUFFIX!r} has shape {list(scale_inv.shape)}, expected {list(want)} "
                          f"(one scale per {br}x{bc} block of the {rows}x{cols} weight)")
    scale = scale_inv.astype(np.float32, copy=False)
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        raise WeightError(f"tensor {name + FP8_SCALE_SUFFIX!r} holds scales that are not finite and positive")
    return scale


def dequantize_fp8_blocks(codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int], name: str = "weight"
                          ) -> np.ndarray:
    """float32 codes * scale_inv[i // block_rows, j // block_cols] for a 2-D e4m3 weight (the last
    blocks of a row or column may be partial, as DeepSeek's own `weight_dequant` allows)."""
    scale = _fp8_scales(scale_inv, codes.shape, block, name)
    br, bc = block
    cols = codes.shape[1]
    out = codes.astype(np.float32)
    for i in range(scale.shape[0]):  # block rows: one [br, cols] slab scaled at a time
        slab = out[i * br:(i + 1) * br]
        slab *= np.repeat(scale[i], bc)[:cols][None, :]
    return out


class CheckpointReader:
    def __init__(self, model_dir: str | Path, fp8_block: tuple[int, int] | None = None,
                 prefixes: tuple | None = None):
        """fp8_block: (rows, cols) of the FP8 weights' scale blocks (config.json's
        quantization_config.weight_block_size); None refuses FP8 tensors. prefixes: a multimodal
        checkpoint's text tower (MLAModelConfig.weight_prefixes): ((our prefix, (its candidate
        prefixes, ...)), ...); its tensors are then read under our names and every other tensor
        (vision tower, projector) is left out."""
        self.model_dir = Path(model_dir)
        self.fp8_block = fp8_block
        self._where: dict[str, Path] = {}
        self._stored: dict[str, str] = {}  # our name -> the name in the file, where they differ
        self._left_out: dict[str, Path] = {}  # a text-tower read: the tensors it leaves out -> their shard
        self._open: dict[Path, SafetensorsFile] = {}
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                items = [(str(name), str(file)) for name, file in weight_map.items()]
            except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
                raise WeightError(f"{index}: not a valid safetensors index ({e})") from e
            for name, file in items:
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
                for name in self._handle(shard).entries:
                    self._where[name] = shard
        if prefixes:
            self._rename(prefixes)

    def _rename(self, prefixes) -> None:
        """Our names for a text tower's tensors (the first candidate prefix the file uses, per
        prefix); the others are dropped."""
        where, stored = {}, {}
        for ours, candidates in prefixes:
            found = next((c for c in candidates if any(n.startswith(c) for n in self._where)), None)
            if found is None:
                continue
            for name, path in self._where.items():
                if name.startswith(found):
                    canonical = ours + name[len(found):]
                    where[canonical], stored[canonical] = path, name
        if not any(n.startswith("model.layers.") for n in where):
            raise WeightError(f"{self.model_dir}: no text-tower layers under any of "
                              f"{[c for _, cs in prefixes for c in cs]}")
        kept = set(stored.values())
        self._left_out = {n: p for n, p in self._where.items() if n not in kept}
        self._where, self._stored = where, stored

    def left_out(self) -> dict[str, dict]:
        """What a text-tower read leaves out (the vision tower, the projector, anything else
        outside the tower's prefixes), by module: {"vision_tower": {"tensors": n, "params": p}, ...}
        (from the headers only; FP8 scales are not parameters). Empty for a plain checkpoint."""
        out: dict[str, dict] = {}
        for name, path in self._left_out.items():
            entry = self._handle(path).entries.get(name)
            if entry is None:
                raise WeightError(f"tensor {name!r} is listed in the index but missing from {path.name}")
            parts = name.split(".")
            module = ".".join(parts[:2] if parts[0] == "model" and len(parts) > 2 else parts[:1])
            g = out.setdefault(module, {"tensors": 0, "params": 0})
            g["tensors"] += 1
            if not name.endswith(FP8_SCALE_SUFFIX):
                g["params"] += int(np.prod(entry[1], dtype=np.int64))
        return dict(sorted(out.items()))

    def _real(self, name: str) -> str:
        return self._stored.get(name, name)

    def _handle(self, path: Path) -> SafetensorsFile:
        if path not in self._open:
            self._open[path] = SafetensorsFile(path)
        return self._open[path]

    def num_params(self) -> int:
        """Values in every tensor of the checkpoint (all shards; from the headers only; FP8 block
        scales are not parameters)."""
        return sum(int(np.prod(shape, dtype=np.int64)) for name, shape, _ in self._headers()
                   if not name.endswith(FP8_SCALE_SUFFIX))

    def has(self, name: str) -> bool:
        return name in self._where

    def names(self):
        """Every tensor name the checkpoint holds (ours, for a text tower read under a prefix)."""
        return iter(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape from its shard's header (no bytes read)."""
        return self._file(name).shape(self._real(name))

    def _file(self, name: str) -> SafetensorsFile:
        if name not in self._where:
            raise WeightError(f"tensor {name!r} is missing from the checkpoint in {self.model_dir}")
        f = self._handle(self._where[name])
        if self._real(name) not in f.entries:
            raise WeightError(f"tensor {name!r} is listed in the index but missing from {f.path.name}")
        return f

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The tensor as a float32 numpy array, checked against `shape` when given."""
        f = self._file(name)
        dtype, got = f.dtype(self._real(name)), f.shape(self._real(name))
        if dtype not in _FLOAT_DTYPES and not (dtype in _FP8_DTYPES and self.fp8_block):
            if dtype in _FP8_DTYPES:
                raise WeightError(f"tensor {name!r} holds FP8 codes but config.json has no quantization_config "
                                  "with quant_method 'fp8' and weight_block_size")
            raise WeightError(f"tensor {name!r} has dtype {dtype}; only F32/F16/BF16 weights and DeepSeek's "
                              "block-scaled F8_E4M3 are supported")
        if shape is not None and got != tuple(shape):
            raise WeightError(f"tensor {name!r} has shape {list(got)}, expected {list(shape)} from config.json")
        if dtype in _FP8_DTYPES:
            arr = dequantize_fp8_blocks(*self._fp8_parts(name, f, got), self.fp8_block, name)
        else:
            arr = f.array(self._real(name)).astype(np.float32, copy=False)
        if not np.isfinite(arr).all():
            raise WeightError(f"tensor {name!r} holds NaN or Inf values")
        return arr

    def _fp8_parts(self, name: str, f: SafetensorsFile, got: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """An FP8 tensor's codes and its checked f32 block scales, each read once."""
        scale_name = name + FP8_SCALE_SUFFIX
        if len(got) != 2 or not self.has(scale_name):
            raise WeightError(f"FP8 tensor {name!r} needs a 2-D shape and its {scale_name!r} (got shape {list(got)})")
        sf = self._file(scale_name)
        if sf.dtype(self._real(scale_name)) not in _FLOAT_DTYPES:
            raise WeightError(f"tensor {scale_name!r} must be float, got {sf.dtype(self._real(scale_name))}")
        return f.array(self._real(name)), _fp8_scales(sf.array(self._real(scale_name)), got, self.fp8_block, name)

    def fp8_rows(self, name: str, shape: tuple[int, int], rows: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """A 2-D FP8 weight's own codes and scales as `--weight-format fp8` keeps them: (e4m3 codes
        [R, C], f32 scales [R, C / block_cols], each row given its block row's scales), rows
        reordered by `rows` when given; None when `name` is not an FP8 tensor or its block width is
        not a multiple of 32 dividing C (then the caller quantizes the dequantised values)."""
        if not self.fp8_block or not self.has(name) or self._file(name).dtype(self._real(name)) not in _FP8_DTYPES:
            return None
        br, bc = self.fp8_block
        if shape[1] % bc or bc % 32:
            return None
        f = self._file(name)
        got = f.shape(self._real(name))
        if got != tuple(shape):
            raise WeightError(f"tensor {name!r} has shape {list(got)}, expected {list(shape)} from config.json")
        codes, scale = self._fp8_parts(name, f, got)
        if ((codes.view(np.uint8) & 0x7F) == 0x7F).any():  # e4m3fn's NaN codes, what get's finite check refuses
            raise WeightError(f"tensor {name!r} holds NaN or Inf values")
        scales = np.repeat(scale, br, axis=0)[:shape[0]]
        if rows is not None:
            codes, scales = codes[rows], scales[rows]
        return codes, np.ascontiguousarray(scales)

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()

    def random_weights(self) -> bool:
        """Whether a shard this checkpoint reads says its weights are random (the mark the
        random-weight writers put in the safetensors metadata: checkpoint/writer.py)."""
        from .writer import says_random_weights

        return any(says_random_weights(self._handle(p).metadata) for p in sorted(set(self._where.values())))

    def nbytes(self, prefix: str = "") -> int:
        """Stored bytes of the tensors whose names start with `prefix` (from the headers only;
        the export's progress display weighs its phases with them)."""
        return sum(size for _, _, size in self._headers(prefix))

    def _headers(self, prefix: str = ""):
        """(name, shape, stored bytes) of every tensor whose name starts with `prefix`."""
        for name in self._where:
            if name.startswith(prefix):
                _, shape, begin, end = self._file(name).entries[self._real(name)]
                yield name, shape, end - begin
