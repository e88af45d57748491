"""MlaQLinear's and MlaMoeExperts' codes, scales and zero points rewritten in 16-row tiles before the
model compiles: int8 and int4 on VNNI CPUs, fp8 on AVX512-BF16 + VBMI CPUs without AMX.

The export stores integer codes in blocks of 4 rows (custom_ops/kernels/qgemm.hpp), which every
kernel reads: one 64-byte load holds 16 inputs of 4 rows, so a dot product's sums sit 4 lanes per
row and each accumulator is converted, scaled and folded per activation block for only 4 rows.
With several activation rows (batched decode, prefill) those folds cost as much as the products on
AVX-512 VNNI CPUs. In the tile16 layout (qmatmul.hpp) one load holds 4 bytes of 16 rows, a row per
int32 lane (int8 and fp8: 4 inputs; int4: 4 inputs in the low nibbles and the 4 inputs 16 further
in the high ones, the 4-row layout's bytes moved whole), and a group's 16 scales and zero points
lie side by side: measured on the 102400 x 2048 int8 lm_head (Zen 4, 2 cores, docs/KERNELS.md) 4
rows 8.3 -> 6.2 ms, 8 rows 9.4 -> 7.6 ms, 1-2 rows the same; a 21888 x 2048 int4 matrix in groups of
128 (`tools/bench_qlinear_layout.py --format int4 --n 21888`) 1-2 rows 1.00-1.07x, 8 rows 1.55-1.59x,
512 rows ~1.2x.

On AMX-INT8 CPUs the int8 tile16 lines are the tiles' B operands as they lie: 8 rows and more load
them straight from the weights, where the 4-row layout is re-laid into scratch on every call
(lm_head, Emerald Rapids: 8 rows 1.08-1.16x faster; 1-2 rows run the VNNI dots, as fast as the
4-row kernel's). int4 codes stay in the 4-row layout there: their AMX path unpacks 4-row blocks.

fp8 (e4m3) codes take the same layout for the bf16 dots of fp8_codes=lut (qgemm_avx512_dots.hpp's
qdot_fp8_t16): a line's 64 codes widened to bf16 are 16 rows x one pair of inputs, so each dot
product takes the token's pair as an embedded broadcast (8 tokens, a 21888 x 2048 matrix streamed
from memory, Zen 4, 2 threads: 1.43-1.67x int8 tile16's time in the 4-row layout, 1.07-1.17x in this
one; 1-2 tokens about as the 4-row layout's).
AMX-BF16 CPUs keep fp8 codes in the 4-row layout, which their tiles read from 8 rows.

MlaMoeExperts' experts take the same layout, int8 and int4 on VNNI CPUs without AMX, fp8 where
MlaQLinear's fp8 codes do: an expert's prefill tokens (tens to hundreds) run the tile16 dots, its
gate and up tiles read side by side (int8, int4; fp8 one after the other at 1-2 tokens) as the
4-row layout's blocks were. One MoE layer at V2-Lite's dims (Zen 4, 2 threads,
`tools/bench_qlinear_layout.py --op moe [--format fp8|int4]`): int8 1024 tokens 1.23x, 8 tokens
1.07-1.17x, 1 token 1.09-1.22x; int4 (groups of 128) 1024 and 96 tokens 1.39-1.43x, 1 token
1.17-1.19x, 2-8 tokens 0.92-1.02x; fp8 96 tokens 1.8x, 1-8 tokens 1.0-1.1x. AMX CPUs keep them as
exported: their experts' prefill runs the 4-row blocks on AMX tiles, which reading the gate and up
tiles side by side would leave.

So under a bf16 hint the runtime rewrites each such op's arrays in place in the weights buffer it
read the IR into (weights_memory.py: private anonymous memory, written before compile and never
after) and sets the op's `layout` attribute to "tile16". Nothing is copied: resident memory stays
the same. The op computes the same products in either layout (any layout on any CPU: a kernel of
the 4-row layout rewrites a tile16 tile back first), so the choice is speed only. The kernel
configuration's qlinear key (mla_export/ops/kernel_config.py, `MLA_EXPORT_KERNELS=qlinear=rows4`)
keeps the exported layout, `qlinear=tile16` forces the rewrite (tests; slower where the CPU has no
VNNI kernel for it).
"""

from __future__ import annotations

import mmap

import numpy as np
import openvino as ov

from ..ops import kernel_config
from ..formats.weight_format import FORMATS, TILE16_ROWS, by_name

__all__ = ["rows4_to_tile16", "tile16_to_rows4", "factors_to_tile16", "tile16_to_factors", "to_tile16", "want_tile16",
           "want_moe_tile16", "pack_qlinear_tiles"]

TILE_ROWS = TILE16_ROWS
_TILE16_BITS = tuple(f.bits for f in FORMATS if f.tile16)
FP8_BITS = by_name("fp8").bits
INT4_BITS = by_name("int4").bits
_CHUNK_ROWS = 4096  # rows rewritten at a time: a bounded temporary (8 MiB at K = 2048)


def _check(codes: np.ndarray) -> tuple[int, int]:
    """(rows, B) of codes [..., N, B] (B: a row's bytes; an MoE's experts: one matrix each) folded
    into [rows, B]: every matrix in whole tiles, so no tile crosses two of them."""
    if codes.dtype != np.uint8 or codes.ndim < 2:
        raise ValueError(f"codes must be a u8 [..., N, K] array, got {codes.dtype} {codes.shape}")
    n, k = codes.shape[-2:]
    if n % TILE_ROWS or k % 16:
        raise ValueError(f"codes [..., N, K] need N % 16 == 0 and K % 16 == 0 for 16-row tiles, got {codes.shape}")
    return codes.size // k, k


def rows4_to_tile16(codes: np.ndarray) -> np.ndarray:
    """Codes [..., N, B] (B: a row's bytes, K for int8 / fp8, K / 2 for int4) in the 4-row layout
    (row 4b + r, byte 16c + j at b * 4B + (4c + r) * 16 + j of its matrix) -> the same bytes in the
    tile16 layout (row 16i + r, byte 4q + e at 16i * B + 64q + 4r + e)."""
    n, k = _check(codes)
    # a row's 4 bytes of one quad stay together in both layouts: moved as one uint32
    a = np.ascontiguousarray(codes).view(np.uint32).reshape(n // 16, 4, k // 16, 4, 4)  # [tile, block, chunk, row, quad]
    return np.ascontiguousarray(a.transpose(0, 2, 4, 1, 3)).view(np.uint8).reshape(codes.shape)


def tile16_to_rows4(codes: np.ndarray) -> np.ndarray:
    """The inverse of rows4_to_tile16."""
    n, k = _check(codes)
    a = np.ascontiguousarray(codes).view(np.uint32).reshape(n // 16, k // 16, 4, 4, 4)  # [tile, chunk, quad, block, row]
    return np.ascontiguousarray(a.transpose(0, 3, 1, 4, 2)).view(np.uint8).reshape(codes.shape)


def _check_factors(a: np.ndarray) -> tuple[int, int]:
    if a.ndim < 2 or a.shape[-2] % TILE_ROWS:
        raise ValueError(f"scales / zero points [..., N, G] need N % 16 == 0 for 16-row tiles, got {a.shape}")
    return a.size // a.shape[-1], a.shape[-1]


def factors_to_tile16(a: np.ndarray) -> np.ndarray:
    """Per-group scales or zero points [..., N, G] (row-major) -> their tile16 order: a tile's 16
    factors of group g side by side (row 16i + r, group g at 16i * G + 16g + r; qmatmul.hpp's
    tile16_factor), so the kernels load a group's 16 at once. One group: the same order."""
    n, g = _check_factors(a)
    return np.ascontiguousarray(a.reshape(n // 16, 16, g).transpose(0, 2, 1)).reshape(a.shape)


def tile16_to_factors(a: np.ndarray) -> np.ndarray:
    """The inverse of factors_to_tile16."""
    n, g = _check_factors(a)
    return np.ascontiguousarray(a.reshape(n // 16, g, 16).transpose(0, 2, 1)).reshape(a.shape)


def to_tile16(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray):
    """One projection's operands (codes [..., N, B], scales and zero points [..., N, G]) in the
    tile16 layout, as the runtime's rewrite leaves them."""
    return rows4_to_tile16(codes), factors_to_tile16(scales), factors_to_tile16(zero_points)


def want_tile16(precision: str, bits: int = 8) -> bool:
    """Whether this process rewrites MlaQLinear codes of this format (`bits`) in 16-row tiles (see
    the module doc)."""
    if bits not in _TILE16_BITS:
        return False
    config = kernel_config.config()
    if config.qlinear != "auto":
        return config.qlinear == "tile16"
    if precision != "bf16" or config.isa != "avx512":
        return False
    if bits == FP8_BITS:  # the lookups' bf16 dots; AMX-BF16 CPUs run fp8 from 8 rows on tiles of the 4-row layout
        return config.fp8_codes == "lut" and not config.amx
    vnni = "avx512_vnni" in kernel_config.cpu_features()
    if bits == INT4_BITS:  # AMX-INT8 CPUs unpack int4 codes from 8 rows onto tiles of the 4-row layout
        return vnni and not config.amx
    return vnni


def want_moe_tile16(precision: str, bits: int = 8) -> bool:
    """Whether this process rewrites MlaMoeExperts' experts of this format in 16-row tiles (see the
    module doc): as MlaQLinear's codes, but on AMX CPUs only when the configuration forces it."""
    config = kernel_config.config()
    return want_tile16(precision, bits) and (config.qlinear != "auto" or not config.amx)


# Each projection an op reads: its codes, scales and zero points inputs, and the bits attribute that
# says their format.
_OPERANDS = {"MlaQLinear": ((1, 2, 3, "bits"),), "MlaMoeExperts": ((3, 4, 5, "w13_bits"), (6, 7, 8, "w2_bits"))}
# What each of those inputs holds: "codes" or "factors" (scales, zero points), by (op type, input).
_ROLE = {(kind, i): ("codes" if i == codes else "factors")
         for kind, projections in _OPERANDS.items() for codes, s, zp, _ in projections for i in (codes, s, zp)}


def _offset_in(data: np.ndarray, buf: np.ndarray) -> int | None:
    """data's byte offset in buf, or None when it does not lie in it (not read into our buffer)."""
    offset = data.ctypes.data - buf.ctypes.data
    return offset if 0 <= offset and offset + data.nbytes <= buf.size else None


def _constants_in(model: ov.Model, buf: np.ndarray) -> dict[int, list]:
    """Every Constant whose data lies in buf, by byte offset (OpenVINO's IR stores identical
    constants once, so several Constants may point at the same bytes)."""
    at: dict[int, list] = {}
    for node in model.get_ops():
        if node.get_type_name() != "Constant":
            continue
        offset = _offset_in(node.data, buf)
        if offset is not None:
            at.setdefault(offset, []).append(node)
    return at


def _operands(op, kind: str, buf: np.ndarray) -> list[tuple[int, int, str]] | None:
    """(byte offset in buf, input index, "codes" | "factors") of each array op reads in the tile16
    layout, when every one is a Constant in buf of a shape in whole tiles; else None."""
    found = []
    for codes_i, s_i, zp_i, _ in _OPERANDS[kind]:
        for index, role in ((codes_i, "codes"), (s_i, "factors"), (zp_i, "factors")):
            const = op.input_value(index).get_node()
            if const.get_type_name() != "Constant":
                return None
            data = const.data
            try:
                _check(data) if role == "codes" else _check_factors(data)
            except ValueError:  # not in whole tiles: leave it as exported
                return None
            offset = _offset_in(data, buf)
            if offset is None:  # not in our buffer: leave it as exported
                return None
            found.append((offset, index, role))
    return found


def pack_qlinear_tiles(model: ov.Model, weights: mmap.mmap | None, precision: str) -> int:
    """Rewrites, in `weights` (the buffer the model's Constants point into, read_ir's), the codes,
    scales and zero points of every MlaQLinear (and MlaMoeExperts) the module doc names from the
    4-row layout into 16-row tiles and marks the op; returns how many ops were marked. Nothing
    happens without that buffer (OpenVINO's read-only file mapping) or when want_tile16() /
    want_moe_tile16() say no. An array is rewritten once however many such ops read it, and only
    when every node that reads its bytes is such an op, marked, at the same input: an op whose
    arrays any other node reads too (say, tied embeddings) stays as exported."""
    wanted = {"MlaQLinear": {bits for bits in _TILE16_BITS if want_tile16(precision, bits)},
              "MlaMoeExperts": {bits for bits in _TILE16_BITS if want_moe_tile16(precision, bits)}}
    if weights is None or not any(wanted.values()):
        return 0
    buf = np.frombuffer(weights, dtype=np.uint8)
    candidates = {}  # op name -> (op, its arrays: _operands)
    for op in model.get_ops():
        kind = op.get_type_name()
        if kind not in _OPERANDS:
            continue
        attrs = op.get_attributes()
        if attrs.get("layout", "rows4") != "rows4" or any(attrs.get(a) not in wanted[kind] for *_, a in _OPERANDS[kind]):
            continue
        found = _operands(op, kind, buf)
        if found is not None:
            candidates[op.get_name()] = (op, found)
    constants = _constants_in(model, buf)

    def readers_agree(op, offset: int, index: int, role: str) -> bool:
        """Every Constant at these bytes has op's shape, and every node reading one is a candidate
        reading it as the same role (codes or factors)."""
        shape = op.input_value(index).get_node().data.shape
        return all(const.data.shape == shape and all(
                   t.get_node().get_name() in candidates
                   and _ROLE.get((t.get_node().get_type_name(), t.get_index())) == role
                   for t in const.output(0).get_target_inputs()) for const in constants.get(offset, ()))

    changed = True
    while changed:  # dropping one op may leave arrays it shared with another read in two layouts
        changed = False
        for name, (op, found) in list(candidates.items()):
            if not all(readers_agree(op, offset, index, role) for offset, index, role in found):
                del candidates[name]
                changed = True
    done: set[int] = set()
    for op, found in candidates.values():
        for offset, index, role in found:
            if offset in done:
                continue
            data = op.input_value(index).get_node().data
            target = buf[offset:offset + data.nbytes].view(data.dtype).reshape(-1, data.shape[-1])
            if role == "codes":
                for r0 in range(0, target.shape[0], _CHUNK_ROWS):
                    r1 = min(target.shape[0], r0 + _CHUNK_ROWS)
                    target[r0:r1] = rows4_to_tile16(np.array(target[r0:r1]))
            elif target.shape[1] > 1:  # one group: the same order
                target[:] = factors_to_tile16(np.array(target))
            done.add(offset)
        op.set_attribute("layout", "tile16")
    return len(candidates)
