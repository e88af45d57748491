"""Smoke test of the end-to-end benchmark (`mla-export bench`, mla_export/bench/): a tiny checkpoint
made by the benchmark's own writer, ours + transformers only, a couple of tokens; checks the
outputs' schema and the greedy agreement field, and that missing peer environments (optimum,
llama.cpp) are reported, not fatal; the medians and ranges over alternated rounds on made-up
results. No timing thresholds."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from mla_export.cli import main  # noqa: E402


def test_bench_e2e_tiny_ours_and_transformers(tmp_path):
    out, work = tmp_path / "res", tmp_path / "work"
    rc = main(["bench", "--shape", "tiny-v2", "--layers", "2", "--systems",
               "ours-f32,transformers,optimum,llamacpp-Q8_0", "--prompt-lens", "16", "--batches", "2",
               "--new-tokens", "3", "--optimum-python", str(tmp_path / "no-such-venv/bin/python"),
               "--llamacpp-dir", str(tmp_path / "no-llamacpp"), "--out-dir", str(out), "--work-dir", str(work),
               "--timeout", "300", "--mem-wait", "0", "--bandwidth-mib", "64", "--bandwidth-passes", "1"])
    assert rc == 0
    doc = json.loads((out / "e2e.json").read_text())
    assert doc["schema_version"] == 2
    assert {"machine", "workload", "systems", "kv_cache", "results", "aggregate", "summary"} <= set(doc)
    assert doc["workload"]["prompt_lens"] == [16] and doc["workload"]["batches"] == [2]
    assert doc["workload"]["model_config"]["model_type"] == "deepseek_v2"
    by = {r["system"]: r for r in doc["results"]}
    assert set(by) == {"ours-f32", "transformers", "optimum", "llamacpp-Q8_0"}
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
    # the reads around every run; no efficiency at batch 2, and none for a system whose bytes are not counted
    assert all(x > 0 for name in ("ours-f32", "transformers") for x in by[name]["read_gbps"])
    assert by["ours-f32"]["weight_bytes_per_token"] > 0 and by["ours-f32"]["efficiency_unknown"].startswith("batch 1 only")
    assert "not counted" in doc["weight_bytes_per_token"]["transformers"]["unknown"]
    # the optimum env is missing: marked not available with the reason
    assert by["optimum"]["ok"] is False and "not found" in by["optimum"]["not_available"]
    assert by["llamacpp-Q8_0"]["ok"] is False and "llama.cpp peer not found" in by["llamacpp-Q8_0"]["not_available"]
    agg = {r["system"]: r for r in doc["aggregate"]}
    assert agg["ours-f32"]["runs_ok"] == 1 and agg["ours-f32"]["decode_tok_s"]["n"] == 1
    assert agg["ours-f32"]["weight_bytes"] > 0 and agg["ours-f32"]["kv_bytes_per_token"] == 2 * 48 * 4
    kv = doc["kv_cache"]
    assert kv["ours_bytes_per_token"] == 2 * (32 + 16) * 4  # layers x (r + dr) x f32
    assert kv["transformers_bytes_per_token"] and kv["ratio_ours_vs_expanded_same_dtype"] == pytest.approx(48 / (4 * 72))
    assert doc["summary"]["greedy_agreement_ours_f32"] == "6/6"
    md = (out / "e2e.md").read_text()
    assert "| ours-f32 | 16 | 2 |" in md and "not available" in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "e2e_decode.png").stat().st_size > 0


def test_aggregate_medians_and_ranges_over_rounds():
    from mla_export.bench.report import aggregate, kv_figures

    cfg = dict(num_hidden_layers=3, num_attention_heads=16, kv_lora_rank=512, qk_rope_head_dim=64,
               qk_nope_head_dim=128, v_head_dim=128)
    kv = kv_figures(cfg, 2, None, None)
    runs = [dict(system="ours-int8", prompt_len=1024, batch=1, round=i, ok=True, ttft_s=t, decode_tok_s=d,
                 peak_rss_mb=m, weight_bytes=10, kv_cache_dtype="bf16") for i, (t, d, m) in
            enumerate([(5.0, 20.0, 900), (7.0, 30.0, 1000), (6.0, 10.0, 800)])]
    runs.append(dict(system="llamacpp-Q8_0", prompt_len=1024, batch=1, round=0, ok=False, not_available="no peer"))
    rows = {r["system"]: r for r in aggregate(runs, kv)}
    assert rows["ours-int8"]["decode_tok_s"] == {"median": 20.0, "min": 10.0, "max": 30.0, "n": 3}
    assert rows["ours-int8"]["ttft_s"]["median"] == 6.0 and rows["ours-int8"]["peak_rss_mb"]["max"] == 1000
    assert rows["ours-int8"]["kv_bytes_per_token"] == 3 * 576 * 2
    assert rows["llamacpp-Q8_0"]["ok"] is False and rows["llamacpp-Q8_0"]["error"] == "no peer"


def test_memory_wait_for_an_export_dir_uses_the_runtimes_estimate(tmp_path):
    """`--export-dir` runs wait for the memory the export's compiled model needs by the runtime's
    own estimate (memory_plan.compiled_need_bytes, what the engine checks before compiling), not
    for a multiple of the weights file: a 16 GB int8 export once waited for 37 GB here and was
    skipped. int8 weights stay compressed when compiled: resident about the file's size."""
    from mla_export.bench.run import _ours_need_gb
    from mla_export.ops.memory_plan import compiled_need_bytes, native_float_types, resident_weight_bytes

    out = tmp_path / "int8"
    assert main(["export", "--preset", "tiny", "-o", str(out), "-q", "--weight-format", "int8"]) == 0
    bins = sum(f.stat().st_size for f in out.glob("*.bin"))
    export = json.loads((out / "mla_graph.json").read_text())["export"]
    resident = resident_weight_bytes(export, "bf16", bins, native_float_types())
    assert 0.5 * bins <= resident <= 1.5 * bins, (resident, bins)
    need = compiled_need_bytes(export, "bf16", bins)
    assert resident < need < 1.5 * resident + (1 << 30)
    assert _ours_need_gb(out, "bf16") == pytest.approx(need / 2**30)
    (out / "mla_graph.json").unlink()  # no contract to read: the weights file's size
    assert _ours_need_gb(out, "bf16") == pytest.approx(bins / 2**30)


def test_profile_groups_name_each_node_kind():
    """The decode-step profile groups the exporter's node names (friendly name, weight input's
    name) by part: the fused MoE node (named <layer>.mlp.routed_experts, input 1 from TopK) is the
    routed experts, not 'other nodes'."""
    from mla_export.bench.workers import classify_node

    cases = {
        ("model.layers.1.mlp.routed_experts", "Reference", "TopK_96"): "MoE routed experts",
        ("model.layers.1.mlp.shared_experts.up_proj", "Reference",
         "model.layers.1.mlp.shared_experts.up_proj.weight.qlinear.q"): "MoE shared expert (FC)",
        ("logits", "Reference", "lm_head.weight.qlinear.q"): "lm_head",
        ("layers.0.paged_attention", "Reference", "Add_37"): "attention op (MLA custom ops, incl. cache write)",
        ("model.layers.0.mlp.down_proj", "Reference", "model.layers.0.mlp.down_proj.weight.qlinear.q"):
            "dense MLP (FC)",
        ("model.layers.2.self_attn.o_proj", "Reference", "model.layers.2.self_attn.o_proj.weight.qlinear.q"):
            "attention projections (FC: q, kv_a, o)",
        ("Multiply_12", "Multiply", ""): "other nodes (norms, rope, routing, gathers, ...)",
    }
    for (name, node_type, weight), want in cases.items():
        assert classify_node(name, node_type, weight) == want, name
