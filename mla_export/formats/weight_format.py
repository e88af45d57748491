"""The weight formats our integer-GEMM ops read as codes (MlaQLinear, MlaMoeExperts), one entry
each: the Python side of custom_ops/kernels/weight_format.hpp, which holds the same table
(tests/test_weight_format.py keeps the two equal). The exporter's quantizer (export/quantize.py)
takes each format's `bits` attribute, code range, codes per byte, group rule and the 4-row layout
from here; the runtime's tile16 rewrite (runtime/qlinear_tiles.py) takes which formats may lie in
16-row tiles. A new format is an entry here and in weight_format.hpp, its quantizer and its kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WeightFormat", "FORMATS", "CODE_BITS", "by_bits", "by_name", "ROWS4_BLOCK_ROWS", "ROWS4_CHUNK_BYTES",
           "TILE16_ROWS"]

# The 4-row layout every format lies in: blocks of 4 rows interleaved by 16-byte chunks (chunk c
# of row 4b + r at ((b * chunks + c) * 4 + r) * 16), so the kernels read 4 rows as one stream.
ROWS4_BLOCK_ROWS = 4
ROWS4_CHUNK_BYTES = 16
TILE16_ROWS = 16  # rows of a tile in the tile16 layout (qmatmul.hpp; int8, int4 and fp8)


@dataclass(frozen=True)
class WeightFormat:
    name: str  # the export's weight_format
    bits: int  # the ops' `bits` attribute
    index: int  # the kernels' tables (QgemmIsa::qdot[index], ...)
    codes_per_byte: int  # int4: two codes a byte
    zero_point_max: int  # w = (q - zp) * s, q and zp in [0, this]; 0: no zero point (w = value(q) * s)
    group_multiple: int  # inputs per scale group: a multiple of this
    chunk_inputs: int  # a row's inputs in one 16-byte chunk of the 4-row layout
    tile16: bool  # may also lie in the tile16 layout

    @property
    def zero_point(self) -> bool:
        return self.zero_point_max > 0


FORMATS = (
    WeightFormat("int8", 8, 0, 1, 255, 32, 16, True),
    WeightFormat("int4", 4, 1, 2, 15, 32, 32, True),
    # float8 e4m3fn codes (DeepSeek-V3 / R1 and Kimi K2 checkpoints' own), the ops' `bits` = 43 ("e4m3")
    WeightFormat("fp8", 43, 2, 1, 0, 32, 16, True),
)
CODE_BITS = tuple(f.bits for f in FORMATS)  # the `bits` values our ops read
_BY_NAME = {f.name: f for f in FORMATS}
_BY_BITS = {f.bits: f for f in FORMATS}


def by_name(name: str) -> WeightFormat:
    if name not in _BY_NAME:
        raise ValueError(f"weight format must be one of {', '.join(_BY_NAME)}, got {name!r}")
    return _BY_NAME[name]


def by_bits(bits: int) -> WeightFormat:
    if bits not in _BY_BITS:
        raise ValueError(f"bits must be one of {', '.join(f'{f.bits} ({f.name})' for f in FORMATS)}, got {bits!r}")
    return _BY_BITS[bits]
