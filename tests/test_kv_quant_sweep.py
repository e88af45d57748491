"""The layouts of tools/kv_quant_sweep.py (the experiment behind docs/KV_CACHE.md's fp8 verdict):
its shipped layouts reproduce mla_export.formats.kv_formats' stored values exactly, so the sweep's
figures are the formats' own; and the precision floor that decides the verdict: every layout of
8-bit e4m3 codes (one scale or group scales, power-of-two scales, a Hadamard rotation) stays
near 3 mantissa bits' error (relative RMS >= 1.8e-2 on Gaussian rows), 4-6x int8's with 4 group
scales. Seeds fixed and printed in the asserts. Numpy only, f64 for the error sums."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from mla_export.formats import kv_formats as kf

_TOOLS = Path(__file__).parents[1] / "tools"
sys.path.insert(0, str(_TOOLS))
_spec = importlib.util.spec_from_file_location("kv_quant_sweep", _TOOLS / "kv_quant_sweep.py")
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)

SEED = 1501


def _rows(r: int, n: int = 512, seed: int = SEED) -> np.ndarray:
    """Gaussian rows: the RMS-normalised latent of the test models, without outlier channels."""
    return np.random.default_rng(seed).standard_normal((n, r)).astype(np.float32).astype(np.float64)


def _rel_rms(y: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(((y - x) ** 2).sum() / (x ** 2).sum()))


@pytest.mark.parametrize("r", [32, 512])
def test_shipped_layouts_match_kv_formats(r):
    x = _rows(r)
    x[:, :2] *= 8  # outlier channels too: the stored values must match whatever the rows hold
    for fmt, layout in (("int8", "int8@4"), ("fp8", "fp8@1")):
        codes, scales = kf.quantise_rows(x.astype(np.float32), fmt, kf.scale_groups(fmt, r))
        want = kf.dequantise_rows(codes, scales)
        np.testing.assert_array_equal(sweep._store(x, layout), want, err_msg=f"{layout} r={r} seed={SEED}")


E4M3_LAYOUTS = ("fp8@1", "fp8@4", "fp8@1/pow2", "fp8@4/pow2", "fp8@1/had", "fp8@4/had")


@pytest.mark.parametrize("r, floor", [(512, 2.4e-2), (32, 1.8e-2)])
def test_no_e4m3_layout_escapes_its_three_mantissa_bits(r, floor):
    # Measured (seed 1501): r = 512 every e4m3 layout 2.57e-2 .. 2.65e-2, int8@4 6.5e-3, fm4 1.33e-2;
    # r = 32 (the test models) fp8@4 is lower, 1.95e-2, only because its 8-value groups store
    # each group's maximum exactly (4 of 32 values), which 128-value groups at r = 512 do not.
    x = _rows(r)
    errs = {layout: _rel_rms(sweep._store(x, layout), x) for layout in E4M3_LAYOUTS + ("int8@4", "fm3", "fm4")}
    for layout in E4M3_LAYOUTS:
        assert errs[layout] >= floor, (r, SEED, errs)
        assert errs[layout] >= 3.5 * errs["int8@4"], (r, SEED, errs)
    # one more mantissa bit halves it: the floor is the code's precision, not its scale or layout
    assert errs["fm4"] <= 0.55 * errs["fm3"], (r, SEED, errs)
