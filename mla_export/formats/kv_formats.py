"""The latent cache's row formats (`kv_dtype`): the one registry of them in Python (FORMATS),
and in numpy their sizes, allocation and the exact quantisation the kernels do
(custom_ops/kernels/cache_formats.hpp is the C++ registry, the same entries).

The contract (mla_export/formats/contract.py), the export's --kv-dtype choices and this module's codec
are derived from FORMATS; a new format is one CacheFormat entry here (and its traits in C++);
docs/KERNELS.md walks through it.

A row holds [kv_c (r values) | k_pe (dr values)], W = r + dr. Float formats store W values of
their `storage` dtype. Quantised formats store

    r x 1-byte code | G x f32 group scale | dr x bf16 k_pe        (r + 4G + 2dr bytes)

quantising the latent part kv_c in G = `groups` equal groups of r / G values (r must be a
multiple of G), each with its own f32 scale: value = code * scale, scale = max|group| / `top`,
computed in f32 as the kernels do: codes = round_half_even(x / scale) clipped to +-top (integer
codes) or x / scale cast to the float code type (float codes); an all-zero group has scale 0 and
codes 0; a group with a non-finite value has a NaN scale and codes 0. k_pe stays bf16 (rotary
keys need range). Each entry's `why` says why its groups are what they are (docs/KV_CACHE.md).

Arrays: float caches are [NB, BS, W] arrays of their dtype (bound to graphs as u8 bytes when
16-bit); quantised caches are u8 [NB, BS, row_bytes] arrays. Runtime-safe: numpy and ml_dtypes
only.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["CacheFormat", "FORMATS", "KV_DTYPES", "VLLM_NAMES", "QUANTISED", "FLOAT_FORMATS", "cache_format", "scale_groups",
           "row_bytes", "bytes_per_value", "storage_dtype", "allocate", "graph_width", "kv_dtype_of",
           "quantise_rows", "dequantise_rows", "encode_rows", "decode_rows", "describe"]

BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class CacheFormat:
    """One row format. Float rows: W values of `storage`. Quantised rows (groups > 0): r codes
    of `storage` (one byte each) in `groups` equal groups, f32 scales, bf16 k_pe."""

    name: str
    storage: np.dtype  # element dtype of float rows; the code dtype of quantised rows
    groups: int = 0  # f32 scales per row over the r latent values; 0: float rows
    top: float = 0.0  # quantised: the largest code magnitude (scale = max|group| / top)
    code: str = ""  # quantised: the code in words (the contract's row_layout)
    why: str = ""  # why the groups are what they are

    @property
    def quantised(self) -> bool:
        return self.groups > 0

    @property
    def graph_dtype(self) -> str:
        """How the custom-op graphs declare the cache: f32 rows as f32, every other format as u8
        bytes (OpenVINO's CPU plugin copies bf16/f16 inputs of a custom op)."""
        return "f32" if self.storage == np.float32 else "u8"

    def row_bytes(self, r: int, dr: int) -> int:
        if self.quantised:
            return r + 4 * self.groups + 2 * dr
        return (r + dr) * self.storage.itemsize

    def encode(self, y: np.ndarray) -> np.ndarray:
        """Codes of f32 values y = x / scale (|y| <= top), rounded as the kernels round."""
        if np.issubdtype(self.storage, np.integer):
            return np.clip(np.rint(y), -self.top, self.top).astype(self.storage)
        return y.astype(self.storage)


def _formats(*entries: CacheFormat) -> dict[str, CacheFormat]:
    for f in entries:  # the C++ side reads codes at one byte each (cache_formats.hpp)
        assert not f.quantised or (f.storage.itemsize == 1 and f.top > 0 and f.code), f
    return {f.name: f for f in entries}


# The registry. Order: float formats first, as the CLI lists them.
FORMATS = _formats(
    CacheFormat("f32", np.dtype(np.float32)),
    CacheFormat("bf16", BF16),
    CacheFormat("f16", np.dtype(np.float16)),
    CacheFormat("int8", np.dtype(np.int8), groups=4, top=127.0, code="int8",
                why="a uniform step shrinks with its group's maximum; 4 groups = 128 values at r = 512, "
                    "the layout of DeepSeek's own 656-byte cache entry"),
    CacheFormat("fp8", np.dtype(ml_dtypes.float8_e4m3fn), groups=1, top=448.0, code="e4m3fn",
                why="3 mantissa bits are relative to each value, so more scales barely change the error"),
    CacheFormat("e5m2", np.dtype(ml_dtypes.float8_e5m2), groups=1, top=57344.0, code="e5m2",
                why="as fp8's, with 2 mantissa bits (twice fp8's step); vLLM's fp8_e5m2 cache"),
)
KV_DTYPES = tuple(FORMATS)
QUANTISED = tuple(n for n, f in FORMATS.items() if f.quantised)
FLOAT_FORMATS = tuple(n for n, f in FORMATS.items() if not f.quantised)
# vLLM's --kv-cache-dtype spellings of these formats (`mla-export serve` takes both).
VLLM_NAMES = {"bfloat16": "bf16", "float32": "f32", "float": "f32", "float16": "f16", "half": "f16",
              "fp8_e4m3": "fp8", "fp8_e5m2": "e5m2"}
assert set(VLLM_NAMES.values()) <= set(FORMATS)


def cache_format(kv_dtype: str) -> CacheFormat:
    """The registry entry of kv_dtype; ValueError naming the choices otherwise."""
    f = FORMATS.get(kv_dtype) if isinstance(kv_dtype, str) else None
    if f is None:
        raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    return f


def _check(kv_dtype: str) -> str:
    cache_format(kv_dtype)
    return kv_dtype


def scale_groups(kv_dtype: str, r: int) -> int:
    """f32 scales per row of a quantised cache (each over r / groups latent values); 0 otherwise."""
    f = cache_format(kv_dtype)
    if not f.quantised:
        return 0
    if r % f.groups:
        raise ValueError(f"an {kv_dtype} cache quantises kv_c in {f.groups} equal groups: kv_lora_rank {r} is not a "
                         f"multiple of {f.groups}")
    return f.groups


def row_bytes(kv_dtype: str, r: int, dr: int) -> int:
    """Bytes of one cache row of r + dr values."""
    f = cache_format(kv_dtype)
    if f.quantised:
        scale_groups(kv_dtype, r)
    return f.row_bytes(r, dr)


def describe(r: int, dr: int) -> str:
    """Every format with its row bytes at latent rank r and rope width dr (the CLI's help)."""
    return ", ".join(f"{n} {row_bytes(n, r, dr)}" for n in KV_DTYPES)


def bytes_per_value(kv_dtype: str, r: int, dr: int) -> float:
    return row_bytes(kv_dtype, r, dr) / (r + dr)


def storage_dtype(kv_dtype: str) -> np.dtype:
    """numpy dtype of the cache array: the float rows' dtype, or u8 bytes for quantised rows."""
    f = cache_format(kv_dtype)
    return np.dtype(np.uint8) if f.quantised else f.storage


def graph_width(kv_dtype: str, r: int, dr: int) -> int:
    """Last dimension of the cache as graphs declare it: W for f32 rows, else bytes per row (u8)."""
    return r + dr if cache_format(kv_dtype).graph_dtype == "f32" else row_bytes(kv_dtype, r, dr)


def allocate(kv_dtype: str, num_blocks: int, block_size: int, r: int, dr: int, fill=0) -> np.ndarray:
    """A zero (or `fill`) cache array of this format."""
    if kv_dtype in QUANTISED:
        return np.full((num_blocks, block_size, row_bytes(kv_dtype, r, dr)), fill, dtype=np.uint8)
    return np.full((num_blocks, block_size, r + dr), fill, dtype=storage_dtype(kv_dtype))


def kv_dtype_of(cache: np.ndarray, kv_dtype: str | None = None) -> str:
    """The format of a cache array: kv_dtype when given (required for u8 quantised caches), else
    by dtype (the float formats')."""
    if kv_dtype is not None:
        _check(kv_dtype)
        want = storage_dtype(kv_dtype)
        if cache.dtype != want:
            raise TypeError(f"a {kv_dtype} cache must be a {want} array, got {cache.dtype}")
        return kv_dtype
    for name in FLOAT_FORMATS:
        if cache.dtype == FORMATS[name].storage:
            return name
    raise TypeError(f"cache dtype {cache.dtype} needs an explicit kv_dtype ({' / '.join(QUANTISED)} caches are u8 "
                    "arrays)")


def quantise_rows(kv_c, kv_dtype: str, groups: int = 1):
    """(codes, scales) of rows kv_c [N, r] in `groups` equal groups, computed in f32 exactly as
    the kernels' cache write: codes of the format's code dtype [N, r], scales f32 [N, groups] (or
    [N] when groups == 1)."""
    fmt = cache_format(kv_dtype)
    if not fmt.quantised:
        raise ValueError(f"quantise_rows needs a quantised format ({', '.join(QUANTISED)}), got {kv_dtype!r}")
    x = np.asarray(kv_c).astype(np.float32)
    if groups != 1:
        n, r = x.shape
        codes, scale = quantise_rows(x.reshape(n * groups, r // groups), kv_dtype)
        return codes.reshape(n, r), scale.reshape(n, groups)
    finite = np.isfinite(x).all(axis=1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(x), x, 0)).max(axis=1, initial=0), 0).astype(np.float32)
    scale = np.where(finite, amax / np.float32(fmt.top), np.float32(np.nan)).astype(np.float32)
    zero = ~finite | (scale == 0)
    safe = np.where(zero, np.float32(1), scale)[:, None]
    with np.errstate(invalid="ignore"):
        y = np.where(zero[:, None], np.float32(0), x / safe).astype(np.float32)
    return fmt.encode(y), scale


def dequantise_rows(codes, scales) -> np.ndarray:
    """code * scale in float64 [N, r]; scales [N] or [N, groups] (equal groups of r / groups)."""
    c = np.asarray(codes).astype(np.float64)
    s = np.asarray(scales, dtype=np.float64)
    if s.ndim == 1:
        return c * s[:, None]
    n, r = c.shape
    return (c.reshape(n, s.shape[1], -1) * s[:, :, None]).reshape(n, r)


def encode_rows(rows, kv_dtype: str, r: int) -> np.ndarray:
    """Rows [N, W] (any float dtype; converted to f32 first like the kernels' inputs) in the
    cache's storage: [N, W] of the float dtype, or u8 [N, row_bytes] for quantised formats."""
    _check(kv_dtype)
    rows = np.asarray(rows)
    if kv_dtype not in QUANTISED:
        return rows.astype(np.float32).astype(storage_dtype(kv_dtype))
    f32 = rows.astype(np.float32)
    g = scale_groups(kv_dtype, r)
    codes, scale = quantise_rows(f32[:, :r], kv_dtype, g)
    k_pe = f32[:, r:].astype(BF16)
    return np.concatenate([codes.view(np.uint8), scale.reshape(len(rows), g).view(np.uint8).reshape(len(rows), 4 * g),
                           k_pe.view(np.uint8).reshape(len(rows), -1)], axis=1)


def decode_rows(stored, kv_dtype: str, r: int) -> np.ndarray:
    """Stored rows (the last axis as encode_rows wrote it) as float64 [..., W]."""
    _check(kv_dtype)
    stored = np.asarray(stored)
    if kv_dtype not in QUANTISED:
        return stored.astype(np.float64)
    lead = stored.shape[:-1]
    flat = np.ascontiguousarray(stored.reshape(-1, stored.shape[-1]))
    code_dtype = FORMATS[kv_dtype].storage
    g = scale_groups(kv_dtype, r)
    codes = flat[:, :r].view(code_dtype)
    scale = flat[:, r:r + 4 * g].copy().view(np.float32).reshape(len(flat), g)
    k_pe = flat[:, r + 4 * g:].copy().view(BF16).astype(np.float64)
    return np.concatenate([dequantise_rows(codes, scale), k_pe], axis=1).reshape(*lead, -1)
