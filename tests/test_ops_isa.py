"""Every kernel path this CPU runs, switched in one process (mla_export.ops.kernel_config, the
switchboard of custom_ops/kernels/kernel_config.hpp), against the float64 reference.

Per vector table (generic, avx2, avx512: the f32 and the integer-GEMM table move together):
attention in both forms, decode, every cache format, sparse attention and its indexer; the fused
MoE op; MlaQLinear on int8 activations (compute="bf16": int8 activations on AVX2 and VNNI tables,
f32-exact on the others, which is what shows the integer table moved), in the tile16 layout, and on
fp8 codes (in both layouts). Per engine of the bf16 decode rows (f32 kernels, AVX512-BF16 dots, AMX tiles, where the
CPU has them): the engine that ran is the one configured. Then the switchboard itself: the default
is the widest table, a bad setting is an error naming the key (MLA_EXPORT_KERNELS or the call), and
the retired variables are refused with their replacement.

Precision: f32 queries and weights against the float64 reference, bf16 / f16 / int8 / fp8 caches
whose stored bytes the reference reads exactly (tests/test_ops_kv_dtypes.py); seeds are fixed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernel_paths import AMX, BF16_DOTS, HAS, PATHS, TABLES, cpu_has, int8_activations, running
from mla_export.ops import kernel_config, kernels
from mla_export.ops import reference as ref
from mla_export.export.quantize import FP8_BITS, fp8_dequantize, fp8_operands

ROOT = Path(__file__).parents[1]
TOL = 2e-5  # f32 accumulation against float64, relative to the output's largest value


def _rel(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("isa", TABLES)
class TestEveryTable:
    def test_attention_and_cache_formats(self, isa):
        import test_ops_kv_dtypes as t
        import test_ops_sparse as sp
        from test_ops_attention import DEEPSEEK, ODD, SMALL, run_case, test_bf16_weights_decode_runs
        from test_ops_decode import run_case as dec

        rng = np.random.default_rng(17)
        with running(f"isa={isa}"):
            for form in ("absorbed", "expanded"):
                run_case(rng, [70, 9], [70, 2], SMALL, form=form)
            for dims in (DEEPSEEK, ODD):  # bf16 up-projections of 1-3 decode rows (gemm_bf16b's row walk)
                for seq_lens in ([70], [70, 3], [1, 130, 19]):
                    test_bf16_weights_decode_runs(rng, dims, seq_lens)
            dec(rng, [300, 1], 4, 64, 16, 16)
            for kv in t.NEW:
                t.test_decode(rng, t.ov_ops, kv, [300, 17], 64, 16, 4, 16)
                for form in ("absorbed", "expanded"):
                    t.test_attention_mixed_batch(rng, t.ov_ops, kv, form)
            t.test_every_e4m3_code_reads_exactly(t.ov_ops)
            t.test_every_e5m2_code_reads_exactly(t.ov_ops)
            for kv in ("f32", "int8"):
                sp.test_indexer_topk_matches_reference(rng, "openvino", kv, 2)
            for kv in ("f32", "fp8"):
                for form in ("absorbed", "expanded"):
                    sp.test_sparse_attention_matches_reference(rng, "openvino", kv, form)
            assert kernel_config.config().isa == isa  # nothing switched it back meanwhile

    def test_moe_experts(self, isa, rng):
        from test_moe_experts_op import _case, _model, _run_openvino

        weights, feeds, want = _case(rng, 6, 128, 64, 2, 30, (4, 8), 32)
        with running(f"isa={isa}"):
            assert _rel(_run_openvino(_model(128, (4, 8), weights), feeds), want) < TOL

    @pytest.mark.parametrize("tokens", [2, 40])
    def test_moe_experts_in_tiles(self, isa, rng, tokens):
        """int8 and int4 experts in 16-row tiles, f32 and compute="bf16" (the tile16 dots on VNNI
        tables, a rewrite back into the 4-row layout on every other), against the reference."""
        from test_moe_tile16 import test_tile16_experts_match_reference

        with running(f"isa={isa}"):
            for bits in ((8, 8), (4, 4)):
                test_tile16_experts_match_reference(rng, "openvino", tokens, bits)

    def test_qlinear_int8_activations(self, isa, rng):
        """compute="bf16": the AVX2 table's vpmaddubsw dots and the AVX-512 one's VNNI ones give the
        reference's result on int8 activations; the portable table (and AVX-512 without VNNI) stays
        f32-exact. On an AVX-512 machine this is what still runs the AVX2 kernels."""
        from test_moe_experts_op import _run_openvino
        from test_qlinear_op import _case, _model

        with running(f"isa={isa}"):
            for bits, group, rows in [(8, 256, 1), (8, 256, 7), (4, 64, 2), (4, 32, 11), (4, 128, 300)]:
                weights, w = _case(rng, 64, 256, bits, group)
                x = rng.standard_normal((rows, 256)).astype(np.float32)
                got = _run_openvino(_model(256, 64, weights, bits, compute="bf16"), {"x": x})
                if int8_activations(isa):
                    assert _rel(got, ref.linear(x, w, q8_group=group)) < 1e-4, (bits, group, rows)
                    assert _rel(got, ref.linear(x, w)) > 1e-6, "int8 activations expected, the result is f32-exact"
                else:
                    assert _rel(got, ref.linear(x, w)) < TOL, (bits, group, rows)

    def test_qlinear_tile16(self, isa, rng):
        """int8 and int4 codes in tiles: the AVX-512 table's tile16 dots on VNNI CPUs, and the 4-row kernels of the others (a tile
        rewritten back first): the reference's result, on int8 activations where the table has them."""
        from test_moe_experts_op import _run_openvino
        from test_qlinear_tiles import _case, _model

        with running(f"isa={isa}"):
            for n, k, group, m, bits in [(64, 256, None, 1, 8), (64, 256, 64, 7, 8), (32, 128, None, 40, 8),
                                         (64, 256, 128, 1, 4), (32, 128, 32, 9, 4)]:
                weights, w = _case(rng, n, k, group, bits)
                x = rng.standard_normal((m, k)).astype(np.float32)
                got = _run_openvino(_model(k, n, weights, "bf16", bits=bits), {"x": x})
                if int8_activations(isa):
                    assert _rel(got, ref.linear(x, w, q8_group=group or k)) < 1e-4, (n, k, group, m)
                else:
                    assert _rel(got, ref.linear(x, w)) < TOL, (n, k, group, m)

    def test_qlinear_fp8_tile16(self, isa, rng):
        """fp8 codes in the tile16 layout: the AVX-512 table's tile16 lookups where the CPU has
        AVX512-BF16 and VBMI, the 4-row kernels of every other table (a tile rewritten back first)."""
        from test_fp8_weights_op import _bf16_path, _bf16_reference
        from test_moe_experts_op import _run_openvino
        from test_qlinear_tiles import _model
        from mla_export.runtime.qlinear_tiles import to_tile16

        with running(f"isa={isa}"):
            for n, k, m in [(64, 256, 1), (32, 512, 8), (64, 128, 19)]:
                w32 = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
                codes, scales, zp = fp8_operands(w32, 128)
                x = rng.standard_normal((m, k)).astype(np.float32)
                got = _run_openvino(_model(k, n, list(to_tile16(codes, scales, zp)), "bf16", bits=FP8_BITS), {"x": x})
                want = _bf16_reference(x, [codes, scales, zp]) if _bf16_path(m) else ref.linear(x, fp8_dequantize(codes, scales))
                assert _rel(got, want) < TOL, (n, k, m)

    def test_qlinear_fp8(self, isa, rng):
        """fp8 codes, f32 and compute="bf16", few rows and many: f32-exact in every table (the bf16
        rows' reference where they run on bf16 activations: test_fp8_weights_op._bf16_path)."""
        from test_fp8_weights_op import _bf16_path, _bf16_reference
        from test_moe_experts_op import _run_openvino
        from test_qlinear_op import _model

        with running(f"isa={isa}"):
            for compute, rows in [(None, 1), (None, 4), ("bf16", 2), (None, 12), ("bf16", 40)]:
                w32 = (rng.standard_normal((64, 256)) * 0.1).astype(np.float32)
                codes, scales, zp = fp8_operands(w32, 128)
                x = rng.standard_normal((rows, 256)).astype(np.float32)
                got = _run_openvino(_model(256, 64, [codes, scales, zp], FP8_BITS, compute=compute), {"x": x})
                bf16 = compute == "bf16" and _bf16_path(rows)
                want = _bf16_reference(x, [codes, scales, zp]) if bf16 else ref.linear(x, fp8_dequantize(codes, scales))
                assert _rel(got, want) < TOL, (compute, rows)



FP8_CODES = ["shift"] + (["lut"] if BF16_DOTS and cpu_has("avx512vbmi") else [])


@pytest.mark.skipif(not BF16_DOTS, reason="the fp8 bf16 dots need AVX512-BF16")
@pytest.mark.parametrize("fp8_codes", FP8_CODES)
def test_fp8_bf16_dots_each_way_of_widening_codes(fp8_codes):
    """compute="bf16" on fp8 codes below 16 rows, with the codes widened by shifts or by VBMI byte
    lookups (fp8_codes): both give the bf16-rows reference (every code, the subnormal ones as 0,
    groups of 32 and 128, 1..9 rows, one pass and two of 4 tokens) for MlaQLinear; the lookups also
    at 40 rows (each block's codes widened once into bf16 lines that five passes read)."""
    from test_fp8_weights_op import _bf16_reference
    from test_moe_experts_op import _run_openvino
    from test_qlinear_op import _model

    rng = np.random.default_rng(29)
    with running(f"isa=avx512,amx=0,fp8_codes={fp8_codes}"):
        for group, rows in [(128, 1), (32, 2), (128, 3), (128, 4), (32, 5), (128, 9)] + (
                [(32, 40), (128, 17)] if fp8_codes == "lut" else []):
            w32 = (rng.standard_normal((64, 256)) * 0.1).astype(np.float32)
            codes, scales, zp = fp8_operands(w32, group)
            codes[:, :4] = np.arange(256, dtype=np.uint8).reshape(64, 4)  # every code somewhere
            codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
            x = rng.standard_normal((rows, 256)).astype(np.float32)
            got = _run_openvino(_model(256, 64, [codes, scales, zp], FP8_BITS, compute="bf16"), {"x": x})
            assert _rel(got, _bf16_reference(x, [codes, scales, zp])) < TOL, (fp8_codes, group, rows)

@pytest.mark.parametrize("spec", PATHS)
def test_bf16_decode_rows_take_the_configured_engine(spec, rng):
    """compute="bf16" single-token rows: under decode_rows=f32 bit for bit the f32 result; under the
    bf16 dots or AMX tiles a bf16 result within the bf16 tolerance, which differs from it (the
    engine ran). Multi-token rows keep the f32 kernels on every path."""
    from paged_problems import make_problem, rel_err
    from test_ops_attention import DEEPSEEK, attention_args

    dims = DEEPSEEK
    p = make_problem(rng, [1, 65, 300, 37], [1, 1, 1, 4], dims["r"] + dims["dr"], 16, "bf16", r=dims["r"])
    args = attention_args(rng, p, dims, "f32", "bf16")
    with running(spec) as config:
        exact = kernels.paged_attention(*args, form="absorbed", num_threads=2)
        got = kernels.paged_attention(*args, form="absorbed", num_threads=2, compute="bf16")
    assert rel_err(got, ref.paged_attention_expanded(*args)) <= 1e-2
    np.testing.assert_array_equal(got[3:], exact[3:])
    if config.decode_rows == "f32":
        np.testing.assert_array_equal(got[:3], exact[:3])
    else:
        assert not np.array_equal(got[:3], exact[:3]), f"{spec}: the {config.decode_rows} engine did not run"


class TestSwitchboard:
    def test_paths_are_what_the_cpu_has(self):
        """On this Zen 4: generic, avx2, avx512 and the bf16 dots; AMX paths only on AMX CPUs."""
        assert "isa=generic" in PATHS
        assert any(p.startswith("isa=avx512") for p in PATHS) == HAS["avx512"]
        assert any("decode_rows=bf16" in p for p in PATHS) == BF16_DOTS
        assert any("amx=1" in p for p in PATHS) == AMX

    def test_default_is_the_widest_the_cpu_has(self):
        res = subprocess.run([sys.executable, "-c", "from mla_export.ops import kernel_config as k; print(k.config().spec)"],
                             env={k: v for k, v in os.environ.items() if k != "MLA_EXPORT_KERNELS"}, cwd=str(ROOT),
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-3000:]
        best = "avx512" if HAS["avx512"] else "avx2" if HAS["avx2"] else "generic"
        engine = "amx" if AMX else "bf16" if BF16_DOTS else "f32"
        fp8 = "lut" if BF16_DOTS and cpu_has("avx512vbmi") else "shift"
        assert res.stdout.strip() == f"isa={best},amx={int(AMX)},decode_rows={engine},qlinear=auto,fp8_codes={fp8}", \
            res.stdout

    def test_the_variable_sets_the_configuration(self):
        """MLA_EXPORT_KERNELS, read at the first kernel call: the ops run what it names, and a bad
        setting fails the op with the variable and the key named."""
        code = ("import numpy as np, sys; sys.path.insert(0, 'tests');"
                "from test_ops_decode import run_case as dec;"
                "dec(np.random.default_rng(3), [20], 2, 16, 8, 8);"
                "from mla_export.ops import kernel_config as k; print(k.config().spec)")
        env = dict(os.environ, MLA_EXPORT_KERNELS="isa=generic, qlinear=rows4")
        res = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(ROOT), capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.strip().endswith("isa=generic,amx=0,decode_rows=f32,qlinear=rows4,fp8_codes=shift"), res.stdout
        env["MLA_EXPORT_KERNELS"] = "isa=avx9000"
        res = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(ROOT), capture_output=True, text=True)
        assert res.returncode != 0
        assert "MLA_EXPORT_KERNELS: isa=avx9000: not one of" in res.stderr, res.stderr[-3000:]

    @pytest.mark.parametrize("spec,message", [
        ("isa=avx9000", "isa=avx9000: not one of auto, generic, avx2, avx512"),
        ("isa", "'isa' is not key=value"),
        ("threads=4", "unknown key 'threads'"),
        ("amx=yes", "amx=yes: not one of auto, 0, 1"),
        ("decode_rows=fast", "decode_rows=fast: not one of"),
        ("qlinear=cols8", "qlinear=cols8: not one of auto, rows4, tile16"),
        ("isa=generic,decode_rows=bf16", "decode_rows=bf16: AVX512-BF16 dots cannot run here"),
        ("amx=1", "amx=1: AMX cannot run here"),
        ("", "spec must be a non-empty string"),
    ])
    def test_a_bad_setting_is_refused_and_changes_nothing(self, spec, message):
        if spec == "amx=1" and AMX:
            pytest.skip("this CPU runs AMX")
        before = kernel_config.config()
        with pytest.raises(ValueError, match=message):
            kernel_config.configure(spec)
        assert kernel_config.config() == before

    def test_configure_sets_both_libraries(self):
        from mla_export import ort_ops_path

        if ort_ops_path() is None:
            pytest.skip("the onnxruntime custom-op library was not built")
        with running("isa=generic"):
            assert kernel_config.library_config(ort_ops_path()).isa == "generic"
        assert kernel_config.library_config(ort_ops_path()) == kernel_config.config()

    @pytest.mark.parametrize("name,value,instead", [
        ("MLA_EXPORT_ISA", "avx2", "MLA_EXPORT_KERNELS=isa=avx2"),
        ("MLA_EXPORT_AMX", "0", "MLA_EXPORT_KERNELS=amx=0"),
        ("MLA_EXPORT_AVX512_BF16", "0", "MLA_EXPORT_KERNELS=decode_rows=f32"),
        ("MLA_EXPORT_QLINEAR_TILES", "1", "qlinear=tile16"),
    ])
    def test_retired_variables_are_refused_with_their_replacement(self, monkeypatch, name, value, instead):
        from mla_export import extension_path

        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=rf"^{name} is no longer read: set .*{instead}"):
            extension_path()


def test_cpu_features_come_from_the_library():
    """The library's probe (what the kernels choose by) answers in /proc/cpuinfo's names; every
    feature it reports is one Linux reports too (Linux may list more: the probe asks only for
    those the kernels use)."""
    features = kernel_config.cpu_features()
    assert features <= {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
                        "avx512_bf16", "avx512vbmi", "amx_tile", "amx_bf16", "amx_int8"}
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo")
    assert features <= set(flags.split(":", 1)[1].split()), features
