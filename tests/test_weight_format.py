"""The weight formats in one table per language: mla_export/formats/weight_format.py (the exporter's
quantizer and the runtime's tile rewrite read it) and custom_ops/kernels/weight_format.hpp (the
kernels key on it) hold the same entries, and the quantizer's operands have the shapes the table
says (codes per byte, the 4-row layout, zero points or none)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from mla_export.export import quantize as qz
from mla_export.formats.weight_format import FORMATS, ROWS4_BLOCK_ROWS, ROWS4_CHUNK_BYTES, by_bits, by_name

HPP = Path(__file__).resolve().parents[1] / "custom_ops" / "kernels" / "weight_format.hpp"


def _cpp_table() -> list[tuple]:
    text = HPP.read_text()
    fp8_bits = int(re.search(r"constexpr int64_t kFp8Bits = (\d+);", text).group(1))
    body = re.search(r"kWeightFormats\[\] = \{(.*?)\n\};", text, re.S).group(1)
    rows = re.findall(r'\{"(\w+)", (\w+), (\d+), (\d+), (\d+), (\d+), (\d+), (true|false)\}', body)
    assert rows, "the pattern no longer matches weight_format.hpp's table"
    return [(name, fp8_bits if bits == "kFp8Bits" else int(bits), int(i), int(pb), int(zp), int(gm), int(ci),
             t16 == "true") for name, bits, i, pb, zp, gm, ci, t16 in rows]


class TestOneTable:
    def test_python_and_cpp_tables_are_equal(self):
        py = [(f.name, f.bits, f.index, f.codes_per_byte, f.zero_point_max, f.group_multiple, f.chunk_inputs,
               f.tile16) for f in FORMATS]
        assert py == _cpp_table()

    def test_the_layout_matches_the_kernels(self):
        """16-byte chunks of 4 rows (qgemm.hpp), each holding chunk_inputs inputs of a row."""
        assert (ROWS4_BLOCK_ROWS, ROWS4_CHUNK_BYTES) == (4, 16)
        for f in FORMATS:
            assert f.chunk_inputs == ROWS4_CHUNK_BYTES * f.codes_per_byte, f

    def test_the_quantizer_reads_the_table(self):
        assert qz.CODE_FORMATS == tuple(f.name for f in FORMATS)
        assert qz.FP8_BITS == by_name("fp8").bits
        assert set(qz.INT_FORMATS) == {f.name for f in FORMATS if f.zero_point}

    def test_unknown_formats_are_refused_by_name(self):
        with pytest.raises(ValueError, match=r"bits must be one of 8 \(int8\), 4 \(int4\), 43 \(fp8\), got 5"):
            by_bits(5)
        with pytest.raises(ValueError, match="weight format must be one of int8, int4, fp8, got 'int3'"):
            by_name("int3")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_operands_have_the_shapes_the_table_says(rng, fmt):
    rows, n_in = 8, 128
    w = (rng.standard_normal((2, rows, n_in)) * 0.1).astype(np.float32)
    if fmt.zero_point:
        qw = qz.quantize(w, fmt.bits, 32 if fmt.codes_per_byte == 2 else None)
        codes, scales, zp = qz.moe_operands(qw)
        assert zp.max() <= fmt.zero_point_max and qw.q.max() <= fmt.zero_point_max
    else:
        codes, scales, zp = qz.fp8_operands(w, qz.fp8_group(n_in))
        assert not zp.any()  # written as 0, never read
    assert codes.dtype == np.uint8 and codes.shape == (2, rows, n_in // fmt.codes_per_byte)
    assert scales.shape == zp.shape and (n_in // scales.shape[-1]) % fmt.group_multiple == 0
