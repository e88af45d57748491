"""The instruction-set tables of the kernels (custom_ops/kernels/isa_*.cpp): each table this CPU
can run gives the reference's answers when forced with MLA_EXPORT_ISA, the library reports the
table that actually ran, the default is the widest the CPU has, and an unusable forced table is a
clear error rather than a silent fallback.

Precision: f32 queries and weights against the float64 reference, bf16 / f16 / int8 / fp8 caches
whose stored bytes the reference reads exactly (tests/test_ops_kv_dtypes.py); seeds are fixed in
the child processes' code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mla_export.cpu_flags import cpu_flags

ROOT = Path(__file__).parents[1]


FLAGS = cpu_flags()
HAS = {
    "generic": True,
    "avx2": {"avx2", "fma", "f16c"} <= FLAGS,
    "avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"} <= FLAGS,
}

REPORT = (
    "import ctypes, openvino, mla_export;"  # openvino first: the extension links libopenvino
    "f = ctypes.CDLL(mla_export.extension_path()).MlaExportIsa; f.restype = ctypes.c_char_p;"
    "print('ISA', f().decode())"
)


def run_child(code: str, isa: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("MLA_EXPORT_ISA", None)
    if isa is not None:
        env["MLA_EXPORT_ISA"] = isa
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=str(ROOT), capture_output=True, text=True)


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_forced_table_runs_and_matches_reference(isa):
    if not HAS[isa]:
        pytest.skip(f"this CPU cannot run the {isa} table")
    code = (
        "import numpy as np, sys; sys.path.insert(0, 'tests');"
        "import test_ops_kv_dtypes as t;"
        "from test_ops_attention import run_case, SMALL;"
        "from test_ops_decode import run_case as dec;"
        "rng = np.random.default_rng(17);"
        "[run_case(rng, [70, 9], [70, 2], SMALL, form=f) for f in ('absorbed', 'expanded')];"
        "dec(rng, [300, 1], 4, 64, 16, 16);"
        "[t.test_decode(rng, t.ov_ops, kv, [300, 17], 64, 16, 4, 16) for kv in t.NEW];"
        "[t.test_attention_mixed_batch(rng, t.ov_ops, kv, f) for kv in t.NEW for f in ('absorbed', 'expanded')];"
        # sparse attention: the indexer's f32 scores and attention over each token's selection
        "import test_ops_sparse as sp;"
        "[sp.test_indexer_topk_matches_reference(rng, 'openvino', kv, 2) for kv in ('f32', 'int8')];"
        "[sp.test_sparse_attention_matches_reference(rng, 'openvino', kv, f) for kv in ('f32', 'fp8')"
        " for f in ('absorbed', 'expanded')];"
        + REPORT
    )
    res = run_child(code, isa)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"ISA {isa}" in res.stdout, res.stdout


def test_default_is_the_widest_table_the_cpu_has():
    res = run_child(REPORT, None)
    assert res.returncode == 0, res.stderr[-3000:]
    best = "avx512" if HAS["avx512"] else "avx2" if HAS["avx2"] else "generic"
    assert f"ISA {best}" in res.stdout, res.stdout


def test_unknown_forced_table_is_an_error():
    code = (
        "import numpy as np, sys; sys.path.insert(0, 'tests');"
        "from test_ops_decode import run_case as dec;"
        "dec(np.random.default_rng(3), [20], 2, 16, 8, 8)"
    )
    res = run_child(code, "avx9000")
    assert res.returncode != 0
    assert "MLA_EXPORT_ISA=avx9000" in res.stderr, res.stderr[-3000:]
