"""Weight compression at export: int8 per output channel and int4 per group, both asymmetric.

The stored form is the one OpenVINO's CPU plugin decompresses on the fly inside its FullyConnected
and Gather kernels (the form NNCF writes): unsigned integer codes `q`, an unsigned zero point `zp`
and a scale `s` per output row (int8) or per group of `group` input values of a row (int4), with

    w = (q - zp) * s        q, zp in [0, 255] (int8) or [0, 15] (int4); s stored as float16.

The reduction (input) axis is the last axis of the array; every other axis indexes output rows, so
a stacked expert tensor [E, out, in] is quantized per (expert, out row). Rounding is to nearest,
and codes are computed with the float16-rounded scale, so `dequantize` reproduces exactly what the
graph computes. Work is done a slab of rows at a time, so quantizing a 1.5 GB expert stack never
holds more than a few slabs of temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.weight_format import FORMATS, ROWS4_BLOCK_ROWS, ROWS4_CHUNK_BYTES, by_bits, by_name

__all__ = ["Quantized", "quantize", "dequantize", "pick_group", "pack_u4", "pack_u4_halves", "unpack_u4_halves",
           "moe_operands", "interleave_rows4", "deinterleave_rows4", "fp8_operands", "fp8_group", "fp8_dequantize", "FP8_BITS",
           "WEIGHT_FORMATS", "FLOAT_FORMATS", "INT_FORMATS", "CODE_FORMATS"]

FLOAT_FORMATS = ("f32", "f16", "bf16")
# The formats whose matmul weights our ops read as codes (mla_export/formats/weight_format.py), of which the
# integer ones (a zero point) OpenVINO's own compressed matmuls read too. fp8: e4m3 codes with an
# f32 scale per (row, group of 128 inputs), read by our ops only (MlaQLinear, MlaMoeExperts); from
# DeepSeek's FP8 checkpoints the codes and block scales are kept as they are.
CODE_FORMATS = tuple(f.name for f in FORMATS)
INT_FORMATS = tuple(f.name for f in FORMATS if f.zero_point)
WEIGHT_FORMATS = FLOAT_FORMATS + CODE_FORMATS
FP8_BITS = by_name("fp8").bits  # the ops' `bits` value for e4m3 codes
FP8_MAX = 448.0
# asymmetric integer formats: codes and zero points share the range [0, zero_point_max]
_LEVELS = {f.bits: f.zero_point_max for f in FORMATS if f.zero_point}
_SLAB = 1 << 16  # values per slab of rows (256 KiB of f32: the temporaries stay in cache, 3x faster than 16 MiB)
_MIN_GROUP = 16


@dataclass
class Quantized:
    """Codes [rows..., G, group] (uint8 holding 0..2^bits-1), zero points and f16 scales [rows..., G, 1]."""

    bits: int
    group: int  # input values per scale; == the input size for per-channel
    q: np.ndarray
    zp: np.ndarray
    scale: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.q.shape[:-2] + (self.q.shape[-2] * self.q.shape[-1],)


def pick_group(in_features: int, requested: int) -> int:
    """The group size actually used for `in_features` inputs: `requested` when it divides them,
    else the largest power-of-two fraction of it (>= 16) that does (10944 inputs with 128 -> 64),
    else one group per row. -1 asks for one group per row (per-channel)."""
    if requested == -1 or requested >= in_features:
        return in_features
    g = requested
    while g >= _MIN_GROUP:
        if in_features % g == 0:
            return g
        g //= 2
    return in_features


def quantize(w: np.ndarray, bits: int, group: int | None = None) -> Quantized:
    """Asymmetric quantization of w [..., in] along its last axis (group = in when None): int8 by
    each row's min/max, int4 with each group's range and scale searched (_searched)."""
    if bits not in _LEVELS:
        raise ValueError(f"bits must be one of {sorted(_LEVELS, reverse=True)}, got {bits}")
    levels = _LEVELS[bits]
    n_in = w.shape[-1]
    group = n_in if group is None else group
    if n_in % group:
        raise ValueError(f"group size {group} does not divide the input size {n_in}")
    rows = int(np.prod(w.shape[:-1], dtype=np.int64))
    flat = w.reshape(rows, n_in // group, group)
    q = np.empty(flat.shape, np.uint8)
    zp = np.empty(flat.shape[:2] + (1,), np.uint8)
    scale = np.empty(flat.shape[:2] + (1,), np.float16)
    step = max(1, _SLAB // n_in)
    for r0 in range(0, rows, step):
        x = flat[r0:r0 + step].astype(np.float32)
        lo = np.minimum(x.min(axis=-1, keepdims=True), 0.0)  # the range holds 0, so 0 is exact
        hi = np.maximum(x.max(axis=-1, keepdims=True), 0.0)
        if levels <= _SEARCH_LEVELS:
            codes, z, s = _searched(x, lo, hi, levels)
        else:
            codes, z, s = _codes(x, lo, hi, levels)
        q[r0:r0 + step] = codes
        zp[r0:r0 + step] = z.astype(np.uint8)
        scale[r0:r0 + step] = s
    lead = w.shape[:-1]
    return Quantized(bits, group, q.reshape(lead + flat.shape[1:]), zp.reshape(lead + zp.shape[1:]),
                     scale.reshape(lead + scale.shape[1:]))


# int4's 16 levels: each group's range is searched (below); int8's 256 levels per row gain too
# little to pay for the passes.
_SEARCH_LEVELS = 15
# The shares of the min/max range tried per group (1.0 first: the search never does worse than
# min/max), then REFITS least-squares refits of the winner's scale. Relative squared error on 2^20
# Gaussian values, group 32 / 128: min/max 0.00652 / 0.01012, this search 0.00607 / 0.00905
# (Student-t(4): 0.00929 / 0.02100 -> 0.0088 / 0.0191); it costs ~1.5-2x min/max's time.
_SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)
_REFITS = 1


def _codes(x, lo, hi, levels, s=None):
    """Codes, zero points and f16 scales of groups x [..., group] for the range [lo, hi] (or the
    scale s given, the zero point still from lo)."""
    if s is None:
        s = ((hi - lo) / levels).astype(np.float16)
        s[s == 0] = np.float16(1.0)  # an all-zero group: any scale, code = zp
    s32 = s.astype(np.float32)
    z = np.clip(np.rint(-lo / s32), 0, levels)
    return np.clip(np.rint(x / s32) + z, 0, levels).astype(np.uint8), z, s


def _error(x, codes, z, s):
    return np.square((codes - z) * s.astype(np.float32) - x).sum(axis=-1, keepdims=True)


def _searched(x, lo, hi, levels):
    """The codes of each group with the least squared error over the ranges _SHRINK keeps of
    [lo, hi] (0 stays inside, so zeros stay exact), then _REFITS least-squares refits of the
    chosen scale (s = sum(x (q - z)) / sum((q - z)^2) for the codes held, rounded to f16; kept
    where the codes taken again err less): as llama.cpp's k-quants search their scales, within
    the stored form w = (q - zp) * s. Only per-group figures are kept between candidates; the
    codes are made again for the winner."""
    best_lo, best_s, best_err = lo, None, None
    for f in _SHRINK:
        codes, z, s = _codes(x, lo * f, hi * f, levels)
        err = _error(x, codes, z, s)
        if best_err is None:
            best_s, best_err = s, err
        else:
            better = err < best_err
            best_lo, best_s, best_err = np.where(better, lo * f, best_lo), np.where(better, s, best_s), \
                np.minimum(err, best_err)
    for _ in range(_REFITS):
        codes, z, _ = _codes(x, best_lo, None, levels, best_s)
        cz = codes.astype(np.float32) - z
        den = np.square(cz).sum(axis=-1, keepdims=True)
        fit = (x * cz).sum(axis=-1, keepdims=True) / np.where(den > 0, den, 1.0)
        s2 = np.where((den > 0) & (fit > 0), fit, best_s.astype(np.float32)).astype(np.float16)
        s2[s2 == 0] = np.float16(1.0)
        c2, z2, _ = _codes(x, best_lo, None, levels, s2)
        e2 = _error(x, c2, z2, s2)
        better = e2 < best_err
        best_s, best_err = np.where(better, s2, best_s), np.minimum(e2, best_err)
    return _codes(x, best_lo, None, levels, best_s)


def dequantize(qw: Quantized) -> np.ndarray:
    """What the graph computes from the stored codes, as float32 [..., in]."""
    w = (qw.q.astype(np.float32) - qw.zp.astype(np.float32)) * qw.scale.astype(np.float32)
    return w.reshape(qw.shape)


def pack_u4(codes: np.ndarray) -> bytes:
    """ONNX/OpenVINO u4 layout: two codes per byte, the first in the low nibble."""
    flat = codes.reshape(-1)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()


def pack_u4_halves(codes: np.ndarray) -> np.ndarray:
    """The fused MoE op's int4 layout (custom_ops/kernels/qgemm.hpp): codes [..., K] (K % 32 == 0)
    -> bytes [..., K / 2] where, in each block of 32 inputs, byte j holds input j in its low nibble
    and input j + 16 in its high nibble (one 16-byte load unpacks to two 16-lane vectors)."""
    k = codes.shape[-1]
    if k % 32:
        raise ValueError(f"int4 rows for the fused MoE op need a multiple of 32 inputs, got {k}")
    blocks = codes.reshape(codes.shape[:-1] + (k // 32, 2, 16)).astype(np.uint8)
    return (blocks[..., 0, :] | (blocks[..., 1, :] << 4)).reshape(codes.shape[:-1] + (k // 2,))


def unpack_u4_halves(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_u4_halves: bytes [..., K / 2] -> codes [..., K]."""
    k2 = packed.shape[-1]
    blocks = packed.reshape(packed.shape[:-1] + (k2 // 16, 1, 16))
    return np.concatenate([blocks & 15, blocks >> 4], axis=-2).reshape(packed.shape[:-1] + (2 * k2,))


def interleave_rows4(codes: np.ndarray) -> np.ndarray:
    """Code bytes [..., rows, B] (rows % 4 == 0, B % 16 == 0) in the fused MoE op's order: blocks of
    4 rows interleaved by 16-byte chunks (chunk c of row 4b + r at ((b * B/16 + c) * 4 + r) * 16),
    so the op reads 4 rows as one contiguous stream. Same shape, bytes reordered."""
    *lead, rows, nbytes = codes.shape
    r, c = ROWS4_BLOCK_ROWS, ROWS4_CHUNK_BYTES
    if rows % r or nbytes % c:
        raise ValueError(f"the fused MoE op interleaves {r} rows by {c} bytes; got {rows} rows of {nbytes} bytes")
    blocks = codes.reshape(*lead, rows // r, r, nbytes // c, c)
    return np.ascontiguousarray(np.swapaxes(blocks, -3, -2)).reshape(codes.shape)


def deinterleave_rows4(codes: np.ndarray) -> np.ndarray:
    """Inverse of interleave_rows4."""
    *lead, rows, nbytes = codes.shape
    r, c = ROWS4_BLOCK_ROWS, ROWS4_CHUNK_BYTES
    blocks = codes.reshape(*lead, rows // r, nbytes // c, r, c)
    return np.ascontiguousarray(np.swapaxes(blocks, -3, -2)).reshape(codes.shape)


def moe_operands(qw: Quantized) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, scales, zero points) of a stacked expert projection [E, rows, in] as the fused MoE op
    reads them (custom_ops/kernels/qgemm.hpp): u8 codes [E, rows, in] (int8) or [E, rows, in / 2]
    (int4, pack_u4_halves), rows interleaved by 4 (interleave_rows4); f32 scales and u8 zero points
    [E, rows, G]. The values are exactly those of `dequantize(qw)`."""
    lead = qw.q.shape[:-2]
    codes = qw.q.reshape(lead + (-1,))
    if by_bits(qw.bits).codes_per_byte == 2:
        codes = pack_u4_halves(codes)
    return (interleave_rows4(codes), qw.scale.reshape(lead + (-1,)).astype(np.float32),
            np.ascontiguousarray(qw.zp.reshape(lead + (-1,))))


def fp8_group(n_in: int, requested: int = 128) -> int | None:
    """Inputs per fp8 scale: `requested` (a checkpoint's block width, else 128) when it divides
    n_in and is a multiple of 32 (the ops' chunking), else the largest halving of it that is; None
    when none is (n_in not a multiple of 32)."""
    g, multiple = requested, by_name("fp8").group_multiple
    while g >= multiple:
        if n_in % g == 0 and g % multiple == 0:
            return g
        g //= 2
    return None


def fp8_operands(w: np.ndarray | None, group: int, source: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, scales, zero points) of a projection [..., rows, in] as the ops read fp8 weights
    (custom_ops/kernels/qgemm.hpp): u8 bytes of e4m3 codes, rows interleaved by 4; f32 scales
    [..., rows, in / group]; u8 zero points, all 0 (the ops do not read them). w ~= e4m3(codes) x scale.

    source: (e4m3 codes [rows, in], f32 scales [rows, in / group]) taken from the checkpoint as
    they are (no second rounding); else w is quantized per (row, group): scale = max|w| / 448."""
    if source is not None:
        codes, scales = source
        codes = np.ascontiguousarray(codes).view(np.uint8)
        scales = np.ascontiguousarray(scales, dtype=np.float32)
    else:
        import ml_dtypes

        w = np.asarray(w, dtype=np.float32)
        lead, n_in = w.shape[:-1], w.shape[-1]
        blocks = w.reshape(lead + (n_in // group, group))
        scales = (np.abs(blocks).max(axis=-1) / np.float32(FP8_MAX)).astype(np.float32)
        scales[scales == 0] = 1.0  # an all-zero group: any scale
        codes = (blocks / scales[..., None]).astype(ml_dtypes.float8_e4m3fn).reshape(w.shape).view(np.uint8)
    return interleave_rows4(codes), scales, np.zeros(scales.shape, np.uint8)


def fp8_dequantize(codes_rows4: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """What the ops compute from fp8_operands' codes and scales, as float32 [..., rows, in]."""
    import ml_dtypes

    codes = deinterleave_rows4(codes_rows4).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    group = codes.shape[-1] // scales.shape[-1]
    return (codes.reshape(scales.shape + (group,)) * scales[..., None]).reshape(codes.shape)
