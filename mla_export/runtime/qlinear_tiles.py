"""MlaQLinear's int8 and fp8 codes rewritten in 16-row tiles before the model compiles, on VNNI CPUs
(int8) and on AVX512-BF16 + VBMI CPUs without AMX (fp8).

The export stores integer codes in blocks of 4 rows (custom_ops/kernels/qgemm.hpp), which every
kernel reads: one 64-byte load holds 16 inputs of 4 rows, so a dot product's sums sit 4 lanes per
row and each accumulator is converted, scaled and folded per activation block for only 4 rows.
With several activation rows (batched decode, prefill) those folds cost as much as the products on
AVX-512 VNNI CPUs. In the tile16 layout (qmatmul.hpp) one load holds 4 inputs of 16 rows, a row per
int32 lane: measured on the 102400 x 2048 int8 lm_head (Zen 4, 2 cores, docs/KERNELS.md) 4 rows
8.3 -> 6.2 ms, 8 rows 9.4 -> 7.6 ms, 1-2 rows the same.

On AMX-INT8 CPUs the tile16 lines are the tiles' B operands as they lie: 8 rows and more load
them straight from the weights, where the 4-row layout is re-laid into scratch on every call
(lm_head, Emerald Rapids: 8 rows 1.08-1.16x faster; 1-2 rows run the VNNI dots, as fast as the
4-row kernel's).

fp8 (e4m3) codes take the same layout for the bf16 dots of fp8_codes=lut (qgemm_avx512_dots.hpp's
qdot_fp8_t16): a line's 64 codes widened to bf16 are 16 rows x one pair of inputs, so each dot
product takes the token's pair as an embedded broadcast (8 tokens, a 21888 x 2048 matrix streamed
from memory, Zen 4, 2 threads: 1.43-1.67x int8 tile16's time in the 4-row layout, 1.07-1.17x in this
one; 1-2 tokens about as the 4-row layout's).
AMX-BF16 CPUs keep fp8 codes in the 4-row layout, which their tiles read from 8 rows.

MlaMoeExperts' experts take the same layout, int8 on VNNI CPUs without AMX, fp8 where MlaQLinear's
fp8 codes do: an expert's prefill tokens (tens to hundreds) run the tile16 dots, its gate and up
tiles read side by side (int8; fp8 one after the other at 1-2 tokens) as the 4-row layout's blocks
were. One MoE layer at V2-Lite's dims (Zen 4, 2 threads, `tools/bench_qlinear_layout.py --op moe
[--format fp8]`): int8 1024 tokens 1.23x, 8 tokens 1.07-1.17x, 1 token 1.09-1.22x; fp8 1024 tokens
1.35-1.39x, 96 tokens 1.66-1.73x, 1-8 tokens 0.98-1.15x (the 3-layer V2-Lite's time to first token:
docs/KERNELS.md). AMX CPUs keep them as exported: their experts' prefill runs the 4-row blocks on
AMX tiles, which reading the gate and up tiles side by side would leave.

So under a bf16 hint on a CPU with AVX512_VNNI (with or without AMX), the runtime rewrites each
int8 MlaQLinear's codes in place in the weights buffer it read the IR into (weights_memory.py:
private anonymous memory, written before compile and never after) and sets the op's `layout`
attribute to "tile16". Nothing is copied: resident memory stays the same. The op computes the
same products in either layout (any layout on any CPU: a kernel of the 4-row layout rewrites a
tile16 tile back first), so the choice is speed only. The kernel configuration's qlinear key
(mla_export/ops/kernel_config.py, `MLA_EXPORT_KERNELS=qlinear=rows4`) keeps the exported layout,
`qlinear=tile16` forces the rewrite (tests; slower where the CPU has no VNNI kernel for it).
"""

from __future__ import annotations

import mmap

import numpy as np
import openvino as ov

from ..ops import kernel_config
from ..formats.weight_format import FORMATS, TILE16_ROWS, by_name

__all__ = ["rows4_to_tile16", "tile16_to_rows4", "want_tile16", "want_moe_tile16", "pack_qlinear_tiles"]

TILE_ROWS = TILE16_ROWS
_TILE16_BITS = tuple(f.bits for f in FORMATS if f.tile16)
FP8_BITS = by_name("fp8").bits
_CHUNK_ROWS = 4096  # rows rewritten at a time: a bounded temporary (8 MiB at K = 2048)


def _check(codes: np.ndarray) -> tuple[int, int]:
    """(rows, K) of codes [..., N, K] (an MoE's experts: one matrix each) folded into [rows, K]:
    every matrix in whole tiles, so no tile crosses two of them."""
    if codes.dtype != np.uint8 or codes.ndim < 2:
        raise ValueError(f"codes must be a u8 [..., N, K] array, got {codes.dtype} {codes.shape}")
    n, k = codes.shape[-2:]
    if n % TILE_ROWS or k % 16:
        raise ValueError(f"codes [..., N, K] need N % 16 == 0 and K % 16 == 0 for 16-row tiles, got {codes.shape}")
    return codes.size // k, k


def rows4_to_tile16(codes: np.ndarray) -> np.ndarray:
    """int8 codes [..., N, K] in the 4-row layout (row 4b + r, input 16c + j at byte
    b * 4K + (4c + r) * 16 + j of its matrix) -> the same bytes in the tile16 layout (row 16i + r,
    input 4q + e at byte 16i * K + 64q + 4r + e)."""
    n, k = _check(codes)
    # a row's 4 codes of one input quad stay together in both layouts: moved as one uint32
    a = np.ascontiguousarray(codes).view(np.uint32).reshape(n // 16, 4, k // 16, 4, 4)  # [tile, block, chunk, row, quad]
    return np.ascontiguousarray(a.transpose(0, 2, 4, 1, 3)).view(np.uint8).reshape(codes.shape)


def tile16_to_rows4(codes: np.ndarray) -> np.ndarray:
    """The inverse of rows4_to_tile16."""
    n, k = _check(codes)
    a = np.ascontiguousarray(codes).view(np.uint32).reshape(n // 16, k // 16, 4, 4, 4)  # [tile, chunk, quad, block, row]
    return np.ascontiguousarray(a.transpose(0, 3, 1, 4, 2)).view(np.uint8).reshape(codes.shape)


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
    return "avx512_vnni" in kernel_config.cpu_features()


def want_moe_tile16(precision: str, bits: int = 8) -> bool:
    """Whether this process rewrites MlaMoeExperts' experts of this format in 16-row tiles (see the
    module doc): as MlaQLinear's codes, but on AMX CPUs only when the configuration forces it."""
    config = kernel_config.config()
    return want_tile16(precision, bits) and (config.qlinear != "auto" or not config.amx)


# The codes inputs each op reads, and the bits attribute that says their format.
_CODES = {"MlaQLinear": ((1, "bits"),), "MlaMoeExperts": ((3, "w13_bits"), (6, "w2_bits"))}


def _codes_in(op, index: int, buf: np.ndarray) -> tuple[int, int, int] | None:
    """(byte offset in buf, rows, inputs) of op's codes input `index` as [rows, K] (an expert axis
    folded into the rows, _check), when they are a Constant in buf that only ops of this kind read
    at this input, u8 in whole tiles; else None."""
    const = op.input_value(index).get_node()
    if const.get_type_name() != "Constant":
        return None
    # codes another kind of node also reads (say, tied embeddings) keep the exported layout
    if any(t.get_node().get_type_name() != op.get_type_name() or t.get_index() != index
           for t in const.output(0).get_target_inputs()):
        return None
    codes = const.data
    try:
        n, k = _check(codes)
    except ValueError:  # not u8 in whole tiles: leave it as exported
        return None
    offset = codes.ctypes.data - buf.ctypes.data
    if offset < 0 or offset + codes.nbytes > buf.size:  # not in our buffer: leave it as exported
        return None
    return offset, n, k


def pack_qlinear_tiles(model: ov.Model, weights: mmap.mmap | None, precision: str) -> int:
    """Rewrites, in `weights` (the buffer the model's Constants point into, read_ir's), the codes of
    every MlaQLinear (and MlaMoeExperts) the module doc names from the 4-row layout into 16-row
    tiles and marks the op; returns how many ops were marked. Nothing happens without that buffer
    (OpenVINO's read-only file mapping) or when want_tile16() / want_moe_tile16() say no. Codes
    shared by several such ops are rewritten once; codes any other node reads too are left as
    exported, and an MoE op is marked only when both its projections can be."""
    wanted = {"MlaQLinear": {bits for bits in _TILE16_BITS if want_tile16(precision, bits)},
              "MlaMoeExperts": {bits for bits in _TILE16_BITS if want_moe_tile16(precision, bits)}}
    if weights is None or not any(wanted.values()):
        return 0
    buf = np.frombuffer(weights, dtype=np.uint8)
    done: set[int] = set()
    marked = 0
    for op in model.get_ops():
        kind = op.get_type_name()
        if kind not in _CODES:
            continue
        attrs = op.get_attributes()
        if attrs.get("layout", "rows4") != "rows4" or any(attrs.get(a) not in wanted[kind] for _, a in _CODES[kind]):
            continue
        found = [_codes_in(op, index, buf) for index, _ in _CODES[kind]]
        if any(f is None for f in found):
            continue
        for offset, n, k in found:
            if offset in done:
                continue
            target = buf[offset:offset + n * k].reshape(n, k)
            for r0 in range(0, n, _CHUNK_ROWS):
                r1 = min(n, r0 + _CHUNK_ROWS)
                target[r0:r1] = rows4_to_tile16(np.array(target[r0:r1]))
            done.add(offset)
        op.set_attribute("layout", "tile16")
        marked += 1
    return marked
