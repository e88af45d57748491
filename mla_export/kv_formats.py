"""The latent cache's row formats (`kv_dtype`), in numpy: sizes, allocation, and the exact
quantisation the kernels do (custom_ops/kernels/cache_format.hpp is the C++ side).

A row holds [kv_c (r values) | k_pe (dr values)], W = r + dr:

| kv_dtype | row                                                       | bytes (r=512, dr=64) |
|----------|-----------------------------------------------------------|---------------------:|
| f32      | W x f32                                                   | 2304 |
| bf16     | W x bf16                                                  | 1152 |
| f16      | W x IEEE half                                             | 1152 |
| int8     | r x int8 code, 4 x f32 group scale, dr x bf16 k_pe        | 656 |
| fp8      | r x float8 e4m3fn code, 1 x f32 scale, dr x bf16 k_pe     | 644 |

int8/fp8 quantise the latent part kv_c in `scale_groups` equal groups of r / G values, each with
its own f32 scale: int8 4 groups (r must be a multiple of 4; 128 values each for r = 512, the
layout of DeepSeek's own 656-byte fp8 entry), fp8 one per row (docs/KV_CACHE.md says why).
value = code * scale, scale = max|group| / 127 (int8) or / 448 (fp8), computed in f32 as the
kernels do: codes = round_half_even(x / scale) (int8, clipped to +-127) or
float8_e4m3fn(x / scale); an all-zero group has scale 0 and codes 0; a group with a non-finite
value has a NaN scale and codes 0. k_pe stays bf16 (rotary keys need range).

Arrays: f32/bf16/f16 caches are [NB, BS, W] arrays of that dtype (bound to graphs as u8 bytes
when 16-bit); int8/fp8 caches are u8 [NB, BS, row_bytes] arrays. Runtime-safe: numpy and
ml_dtypes only.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["KV_DTYPES", "QUANTISED", "scale_groups", "row_bytes", "bytes_per_value", "storage_dtype", "allocate", "graph_width",
           "kv_dtype_of", "quantise_rows", "dequantise_rows", "encode_rows", "decode_rows"]

KV_DTYPES = ("f32", "bf16", "f16", "int8", "fp8")
QUANTISED = ("int8", "fp8")
BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_FLOAT_STORAGE = {"f32": np.dtype(np.float32), "bf16": BF16, "f16": np.dtype(np.float16)}
_TOP = {"int8": np.float32(127.0), "fp8": np.float32(448.0)}


def _check(kv_dtype: str) -> str:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    return kv_dtype


_GROUPS = {"int8": 4, "fp8": 1}  # f32 scales per row (custom_ops/kernels/cache_format.cpp: scale_groups)


def scale_groups(kv_dtype: str, r: int) -> int:
    """f32 scales per row of an int8/fp8 cache (each over r / groups latent values); 0 otherwise."""
    _check(kv_dtype)
    if kv_dtype not in QUANTISED:
        return 0
    g = _GROUPS[kv_dtype]
    if r % g:
        raise ValueError(f"an {kv_dtype} cache quantises kv_c in {g} equal groups: kv_lora_rank {r} is not a multiple of {g}")
    return g


def row_bytes(kv_dtype: str, r: int, dr: int) -> int:
    """Bytes of one cache row of r + dr values."""
    _check(kv_dtype)
    if kv_dtype in QUANTISED:
        return r + 4 * scale_groups(kv_dtype, r) + 2 * dr
    return (r + dr) * _FLOAT_STORAGE[kv_dtype].itemsize


def bytes_per_value(kv_dtype: str, r: int, dr: int) -> float:
    return row_bytes(kv_dtype, r, dr) / (r + dr)


def storage_dtype(kv_dtype: str) -> np.dtype:
    """numpy dtype of the cache array: f32/bf16/f16 rows, or u8 bytes for int8/fp8."""
    _check(kv_dtype)
    return np.dtype(np.uint8) if kv_dtype in QUANTISED else _FLOAT_STORAGE[kv_dtype]


def graph_width(kv_dtype: str, r: int, dr: int) -> int:
    """Last dimension of the cache as graphs declare it: W for f32, else bytes per row (u8)."""
    return r + dr if kv_dtype == "f32" else row_bytes(kv_dtype, r, dr)


def allocate(kv_dtype: str, num_blocks: int, block_size: int, r: int, dr: int, fill=0) -> np.ndarray:
    """A zero (or `fill`) cache array of this format."""
    if kv_dtype in QUANTISED:
        return np.full((num_blocks, block_size, row_bytes(kv_dtype, r, dr)), fill, dtype=np.uint8)
    return np.full((num_blocks, block_size, r + dr), fill, dtype=storage_dtype(kv_dtype))


def kv_dtype_of(cache: np.ndarray, kv_dtype: str | None = None) -> str:
    """The format of a cache array: kv_dtype when given (required for u8 int8/fp8 caches), else
    by dtype (f32, bf16, f16)."""
    if kv_dtype is not None:
        _check(kv_dtype)
        want = storage_dtype(kv_dtype)
        if cache.dtype != want:
            raise TypeError(f"a {kv_dtype} cache must be a {want} array, got {cache.dtype}")
        return kv_dtype
    for name, dt in _FLOAT_STORAGE.items():
        if cache.dtype == dt:
            return name
    raise TypeError(f"cache dtype {cache.dtype} needs an explicit kv_dtype (int8 / fp8 caches are u8 arrays)")


def quantise_rows(kv_c, kv_dtype: str, groups: int = 1):
    """(codes, scales) of rows kv_c [N, r] in `groups` equal groups, computed in f32 exactly as
    the kernels' cache write: codes int8 or float8_e4m3fn [N, r], scales f32 [N, groups] (or [N]
    when groups == 1)."""
    x = np.asarray(kv_c).astype(np.float32)
    if groups != 1:
        n, r = x.shape
        codes, scale = quantise_rows(x.reshape(n * groups, r // groups), kv_dtype)
        return codes.reshape(n, r), scale.reshape(n, groups)
    finite = np.isfinite(x).all(axis=1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(x), x, 0)).max(axis=1, initial=0), 0).astype(np.float32)
    scale = np.where(finite, amax / _TOP[kv_dtype], np.float32(np.nan)).astype(np.float32)
    zero = ~finite | (scale == 0)
    safe = np.where(zero, np.float32(1), scale)[:, None]
    with np.errstate(invalid="ignore"):
        y = np.where(zero[:, None], np.float32(0), x / safe).astype(np.float32)
    if kv_dtype == "int8":
        codes = np.clip(np.rint(y), -127, 127).astype(np.int8)
    else:
        codes = y.astype(E4M3)
    return codes, scale


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
    cache's storage: [N, W] of the float dtype, or u8 [N, row_bytes] for int8/fp8."""
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
    code_dtype = np.dtype(np.int8) if kv_dtype == "int8" else E4M3
    g = scale_groups(kv_dtype, r)
    codes = flat[:, :r].view(code_dtype)
    scale = flat[:, r:r + 4 * g].copy().view(np.float32).reshape(len(flat), g)
    k_pe = flat[:, r + 4 * g:].copy().view(BF16).astype(np.float64)
    return np.concatenate([dequantise_rows(codes, scale), k_pe], axis=1).reshape(*lead, -1)
