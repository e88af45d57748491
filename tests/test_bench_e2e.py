"""Smoke test of the end-to-end benchmark (tools/bench_e2e.py via `mla-export bench`): a tiny
model, ours + transformers only, a couple of tokens; checks the outputs' schema and the greedy
agreement field, and that a missing optimum env is reported, not fatal. No timing thresholds."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from mla_export.cli import main  # noqa: E402


def test_bench_e2e_tiny_ours_and_transformers(tmp_path):
    out, work = tmp_path / "res", tmp_path / "work"
    rc = main(["bench", "--shape", "tiny", "--systems", "ours-f32,transformers,optimum", "--prompt-lens", "16",
               "--batches", "2", "--new-tokens", "3", "--optimum-python",
               str(tmp_path / "no-such-venv/bin/python"), "--out-dir", str(out), "--work-dir", str(work),
               "--timeout", "300"])
    assert rc == 0
    doc = json.loads((out / "e2e.json").read_text())
    assert doc["schema_version"] == 1
    assert {"machine", "workload", "systems", "kv_cache", "results", "summary"} <= set(doc)
    assert doc["workload"]["prompt_lens"] == [16] and doc["workload"]["batches"] == [2]
    by = {r["system"]: r for r in doc["results"]}
    assert set(by) == {"ours-f32", "transformers", "optimum"}
    for name in ("ours-f32", "transformers"):
        r = by[name]
        assert r["ok"], r.get("error")
        assert r["prompt_len"] == 16 and r["batch"] == 2
        for key in ("ttft_s", "decode_tok_s", "decode_tok_s_mean", "peak_rss_mb", "inference_precision"):
            assert isinstance(r[key], (int, float, str)) and r[key] is not None, key
        assert r["ttft_s"] > 0 and r["decode_tok_s"] > 0 and r["peak_rss_mb"] > 0
        assert len(r["tokens"]) == 2 and all(len(t) == 3 for t in r["tokens"])
    assert by["ours-f32"]["inference_precision"] == "f32"
    # greedy agreement with transformers: the field, and its value on this fixed-seed model at f32
    a = by["ours-f32"]["agreement"]
    assert a["tokens_total"] == 6 and a["sequences"] == 2 and len(a["first_divergence"]) == 2
    assert a["tokens_matching"] == 6 and a["sequences_identical"] == 2 and a["frac"] == 1.0
    assert "agreement" not in by["transformers"]
    # the optimum env is missing: marked not available with the reason
    assert by["optimum"]["ok"] is False and "not found" in by["optimum"]["not_available"]
    kv = doc["kv_cache"]
    assert kv["ours_bytes_per_token"] == 2 * (32 + 16) * 4  # layers x (r + dr) x f32
    assert kv["transformers_bytes_per_token"] and kv["ratio_ours_vs_expanded_same_dtype"] == pytest.approx(48 / (4 * 72))
    assert doc["summary"]["greedy_agreement_ours_f32"] == "6/6"
    md = (out / "e2e.md").read_text()
    assert "| ours-f32 | 16 | 2 |" in md and "not available" in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "e2e_decode.png").stat().st_size > 0
