"""The resident-memory estimate the runtime checks before compiling, and its error."""

from __future__ import annotations

import pytest

from mla_export.ops import memory_plan
from mla_export.ops.memory_plan import InsufficientMemoryError, check_fits, resident_weight_bytes

EXPORT_INT8 = dict(weight_format="int8", weight_dtype="bf16", weight_params={"int8": 1_000_000, "bf16": 1000})


def test_resident_bytes_by_storage_type():
    # int8 weights stay 1 byte; the float remainder is widened to f32 on a CPU without native bf16
    assert resident_weight_bytes(EXPORT_INT8, "bf16", 0, native=set()) == 1_000_000 + 4000
    assert resident_weight_bytes(EXPORT_INT8, "bf16", 0, native={"bf16"}) == 1_000_000 + 2000
    assert resident_weight_bytes(EXPORT_INT8, "f32", 0, native={"bf16"}) == 1_000_000 + 4000  # f32 asked: widened
    int4 = dict(weight_format="int4", weight_params={"int4": 1280}, int4_group_sizes=[128])
    assert resident_weight_bytes(int4, "f32", 0, native=set()) == 1280 // 2 + 45
    # exports without the counts: the weights file, doubled where bf16 would be widened
    old = dict(weight_dtype="bf16")
    assert resident_weight_bytes(old, "bf16", 500, native=set()) == 1000
    assert resident_weight_bytes(old, "bf16", 500, native={"bf16"}) == 500


def test_check_fits_names_the_need_and_the_way_out(tmp_path, monkeypatch):
    weights = tmp_path / "openvino_model.bin"
    weights.write_bytes(b"\0" * 16)
    big = dict(EXPORT_INT8, weight_params={"int8": 64 << 30})
    monkeypatch.setattr(memory_plan, "available_bytes", lambda: 8 << 30)
    monkeypatch.delenv(memory_plan.SKIP_ENV, raising=False)
    with pytest.raises(InsufficientMemoryError, match=r"needs about 70\.8 GiB .* only 8\.0 GiB .*--weight-format int4"):
        check_fits(big, "bf16", weights, native=set())
    assert check_fits(EXPORT_INT8, "bf16", weights, native=set()) > 1_000_000
    monkeypatch.setenv(memory_plan.SKIP_ENV, "1")
    assert check_fits(big, "bf16", weights, native=set()) > 8 << 30  # told to try anyway
