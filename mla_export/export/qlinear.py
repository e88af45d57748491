"""lm_head and the int8 / int4 / fp8 projections as MlaQLinear nodes of our extension (custom_ops/kernels/qlinear.hpp).

lm_head is the largest single weight a decode step reads (V2-Lite: 102400 x 2048, 210 MB in int8)
and it only ever sees a few rows (one per sequence), so its speed is the speed of streaming its
codes. The op reads them in place in the layout the fused MoE op uses (moe_operands: 4-row
interleaved codes, f32 scales, u8 zero points) and dequantises in registers; the CPU plugin's
compressed FullyConnected in its place streams int8 ~20% and int4 ~2x below memory speed here.
Graphs that must run on stock runtimes (the portable ONNX) keep the plain Gemm.
"""

from __future__ import annotations

import numpy as np

from ..formats.weight_format import CODE_BITS
from .graph import GraphBuilder
from .quantize import FP8_BITS, fp8_group, fp8_operands, moe_operands, pick_group, quantize

__all__ = ["qlinear_problem", "qlinear"]


def qlinear_problem(n_out: int, n_in: int, bits: int | None, group_size: int) -> str | None:
    """Why MlaQLinear cannot hold this weight (None: it can)."""
    if bits not in CODE_BITS:
        return "MlaQLinear reads int8/int4/fp8 weights"
    if n_in % 32 or n_out % 32:
        return f"MlaQLinear needs input and output sizes divisible by 32 (got {n_in}, {n_out})"
    if bits == FP8_BITS and fp8_group(n_in) is None:
        return f"MlaQLinear needs fp8 groups of a multiple of 32 inputs ({n_in} inputs)"
    if bits == 4 and pick_group(n_in, group_size) % 32:
        return f"MlaQLinear needs int4 groups of a multiple of 32 inputs (--group-size {group_size} on {n_in} inputs)"
    return None


def qlinear(g: GraphBuilder, name: str, w: np.ndarray, x: str, bits: int, out: str, record: bool = True,
            fp8_source: tuple[np.ndarray, np.ndarray] | None = None) -> str:
    """x @ w^T as one MlaQLinear node named `out` (its output too), w [N, K] stored as its codes.
    record: count the weight in the export's stats (False when another variant's Gemm on the same
    weight already counts it). fp8_source: an FP8 checkpoint's own (codes, row scales) of w, kept
    as they are (CheckpointReader.fp8_rows)."""
    fmt = g.store.format
    n_in = w.shape[-1]
    if bits == FP8_BITS:
        group = n_in // fp8_source[1].shape[-1] if fp8_source is not None else fp8_group(n_in)
        codes, scales, zeros = fp8_operands(w, group, fp8_source)
        if record:
            fmt.record("fp8", w.size)
    else:
        group = pick_group(n_in, fmt.group_size) if bits == 4 else n_in
        codes, scales, zeros = moe_operands(quantize(w, bits, group))
        if record:
            fmt.record(f"int{bits}", w.size, group if bits == 4 else None)
    operands = [g.store.add(f"{name}.qlinear.q", codes), g.store.add(f"{name}.qlinear.scale", scales),
                g.store.add(f"{name}.qlinear.zp", zeros)]
    return g.op("MlaQLinear", x, *operands, domain="mla_export", name=out, bits=bits)
