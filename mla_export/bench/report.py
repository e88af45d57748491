"""The benchmark's figures from its per-run results: medians and ranges over the alternated runs,
KV-cache bytes per token, greedy agreement with transformers, the headline ratios, the markdown
table and the decode plot."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .common import type_bytes

# headline pairs: (ours, peer) compared at the same weight bits where both ran
PAIRS = [("ours-int8", "llamacpp-Q8_0"), ("ours-int4", "llamacpp-Q4_K_M"), ("ours-int4-all", "llamacpp-Q4_K_M"), ("ours-bf16", "vllm-bf16"),
         ("ours-int8", "vllm-bf16"), ("ours-int4", "vllm-bf16"), ("ours-bf16", "llamacpp-Q8_0"),
         ("ours-f32", "transformers"), ("ours-bf16", "optimum"), ("ours-int8", "optimum-int8"), ("ours-fp8", "ours-int8"),
         ("ours-int8", "ik-Q8_0"), ("ours-int4", "ik-Q4_K_M"), ("ours-int4-all", "ik-Q4_K_M")]


def agreement(toks: list[list[int]], ref: list[list[int]]) -> dict:
    match = total = identical = 0
    first_div = []
    for a, b in zip(toks, ref):
        n = min(len(a), len(b))
        match += sum(x == y for x, y in zip(a[:n], b[:n]))
        total += max(len(a), len(b))
        d = next((i for i in range(n) if a[i] != b[i]), None if len(a) == len(b) else n)
        first_div.append(d)
        identical += d is None
    return {"tokens_matching": match, "tokens_total": total, "frac": match / total if total else None,
            "sequences_identical": identical, "sequences": len(ref), "first_divergence": first_div}


def kv_figures(model_cfg: dict, ours_dtype_bytes: int, optimum_kv_bytes: int | None,
               transformers_measured: float | None) -> dict:
    L, H = model_cfg["num_hidden_layers"], model_cfg["num_attention_heads"]
    W = model_cfg["kv_lora_rank"] + model_cfg["qk_rope_head_dim"]
    dk, dv = model_cfg["qk_nope_head_dim"] + model_cfg["qk_rope_head_dim"], model_cfg["v_head_dim"]
    ours = L * W * ours_dtype_bytes
    exp_elems = L * H * (dk + dv)
    return {
        "layers": L, "heads": H, "latent_row_width": W, "expanded_values_per_layer": H * (dk + dv),
        "ours_bytes_per_token": ours, "ours_dtype_bytes": ours_dtype_bytes,
        "expanded_f32_bytes_per_token": exp_elems * 4,
        "optimum_bytes_per_token": exp_elems * optimum_kv_bytes if optimum_kv_bytes else None,
        "optimum_dtype_bytes": optimum_kv_bytes,
        # transformers 5 caches DeepSeek's compressed latent (f32) and re-expands it every step:
        # its figure is the live cache's, measured by the worker
        "transformers_bytes_per_token": int(round(transformers_measured)) if transformers_measured else None,
        "ratio_ours_vs_expanded_same_dtype": W / (H * (dk + dv)),
        "ratio_ours_vs_optimum": (ours / (exp_elems * optimum_kv_bytes)) if optimum_kv_bytes else None,
        "ratio_ours_vs_transformers": ours / transformers_measured if transformers_measured else None,
    }


def kv_bytes_per_token(r: dict, kv: dict) -> float | None:
    """A system's KV bytes per token: measured where the system reports it, else from its layout."""
    s = r["system"]
    if r.get("kv_bytes_per_token_measured"):
        return r["kv_bytes_per_token_measured"]
    if s.startswith("ours"):  # quantised rows carry a few scale bytes more (docs/KV_CACHE.md)
        return kv["layers"] * kv["latent_row_width"] * (type_bytes(r.get("kv_cache_dtype")) or 2)
    if s.startswith("vllm"):  # CPU_MLA: one latent row per token and layer at the model dtype
        return kv["layers"] * kv["latent_row_width"] * (4 if "32" in str(r.get("kv_cache_dtype")) else 2)
    if s == "transformers":
        return kv.get("transformers_bytes_per_token")
    if s.startswith("optimum"):
        return kv.get("optimum_bytes_per_token")
    return None


def _stats(vals: list[float]) -> dict | None:
    vals = [v for v in vals if isinstance(v, (int, float))]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def aggregate(results: list[dict], kv: dict) -> list[dict]:
    """One row per (system, prompt, batch): medians and ranges over its runs."""
    keys = list(dict.fromkeys((r["system"], r["prompt_len"], r["batch"]) for r in results))
    rows = []
    for system, plen, batch in keys:
        runs = [r for r in results if (r["system"], r["prompt_len"], r["batch"]) == (system, plen, batch)]
        ok = [r for r in runs if r.get("ok")]
        row = {"system": system, "prompt_len": plen, "batch": batch, "runs": len(runs), "runs_ok": len(ok)}
        if not ok:
            row.update(ok=False, error=str(runs[-1].get("not_available") or runs[-1].get("error")),
                       not_available=bool(runs[-1].get("not_available")))
            rows.append(row)
            continue
        row["ok"] = True
        for k in ("ttft_s", "decode_tok_s", "decode_tok_s_mean", "peak_rss_mb"):
            row[k] = _stats([r.get(k) for r in ok])
        first = ok[0]
        row["weight_bytes"] = first.get("weight_bytes")
        row["kv_bytes_per_token"] = kv_bytes_per_token(first, kv)
        row["inference_precision"] = first.get("inference_precision")
        row["agreement"] = first.get("agreement")
        loads = [x for r in ok for x in (r.get("loadavg") or [])]
        row["loadavg_range"] = [min(loads), max(loads)] if loads else None
        # the plain read around each run and the run's efficiency against it (run.py _efficiency)
        row["read_gbps_before"] = _stats([(r.get("read_gbps") or [None])[0] for r in ok])
        row["read_gbps_after"] = _stats([(r.get("read_gbps") or [None, None])[1] for r in ok])
        row["weight_bytes_per_token"] = first.get("weight_bytes_per_token")
        row["efficiency"] = _stats([r.get("efficiency") for r in ok])
        if row["efficiency"] is None:
            row["efficiency_unknown"] = next((r["efficiency_unknown"] for r in ok if r.get("efficiency_unknown")), None)
        rows.append(row)
    return rows


def _med(row: dict | None, key: str):
    v = (row or {}).get(key)
    return v["median"] if isinstance(v, dict) else None


def summary(doc: dict) -> dict:
    agg = doc["aggregate"]
    s = {}
    for plen in doc["workload"]["prompt_lens"]:
        for batch in doc["workload"]["batches"]:
            at = {r["system"]: r for r in agg if r["prompt_len"] == plen and r["batch"] == batch and r.get("ok")}
            for a, b in PAIRS:
                if a in at and b in at and _med(at[b], "decode_tok_s"):
                    key = f"p{plen}_b{batch}_{a}_vs_{b}"
                    s[key + "_decode"] = round(_med(at[a], "decode_tok_s") / _med(at[b], "decode_tok_s"), 2)
                    if _med(at[a], "ttft_s"):
                        s[key + "_ttft_peer_over_ours"] = round(_med(at[b], "ttft_s") / _med(at[a], "ttft_s"), 2)
    for r in agg:
        if r.get("ok") and r.get("efficiency"):
            s[f"p{r['prompt_len']}_b{r['batch']}_{r['system']}_efficiency"] = round(r["efficiency"]["median"], 3)
    for system in dict.fromkeys(r["system"] for r in doc["results"]):
        agr = [r["agreement"] for r in doc["results"] if r["system"] == system and r.get("agreement")]
        if agr:
            s[f"greedy_agreement_{system.replace('-', '_')}"] = (
                f"{sum(a['tokens_matching'] for a in agr)}/{sum(a['tokens_total'] for a in agr)}")
    kv = doc["kv_cache"]
    s["kv_bytes_ratio_ours_vs_expanded_same_dtype"] = round(kv["ratio_ours_vs_expanded_same_dtype"], 4)
    return s


def _fmt(x, spec=".2f", na="-"):
    if x is None:
        return na
    try:
        return format(x, spec)
    except (TypeError, ValueError):
        return str(x)


def _rng(st: dict | None, spec: str) -> str:
    if not st:
        return "-"
    if st["n"] == 1 or st["min"] == st["max"]:
        return format(st["median"], spec)
    return f"{format(st['median'], spec)} ({format(st['min'], spec)}-{format(st['max'], spec)})"


def markdown(doc: dict) -> str:
    m, w, kv = doc["machine"], doc["workload"], doc["kv_cache"]
    c = w["model_config"]
    q = f", q_lora_rank {c['q_lora_rank']}" if c.get("q_lora_rank") else ""
    lines = [
        f"### End-to-end: {c['num_hidden_layers']}-layer {c.get('model_type', 'DeepSeek')} checkpoint",
        "",
        f"Checkpoint `{w['checkpoint']}`: hidden {c['hidden_size']}, {c['num_attention_heads']} heads, "
        f"kv_lora_rank {c['kv_lora_rank']}{q}, rope {c['qk_rope_head_dim']}, nope {c['qk_nope_head_dim']}, "
        f"v {c['v_head_dim']}, {c['num_hidden_layers']} layers (first {c['first_k_dense_replace']} dense, "
        f"intermediate {c['intermediate_size']}), MoE {c['n_routed_experts']} experts top-{c['num_experts_per_tok']} "
        f"+ {c['n_shared_experts']} shared (moe_intermediate {c['moe_intermediate_size']}), vocab {c['vocab_size']}; "
        f"random prompts (seed {w['seed']}), {w['new_tokens']} new tokens, greedy, EOS ignored. {doc['threads']} "
        f"threads. {w['repeats']} alternated run(s) per point: median (range). CPU: {m['cpu']} ({m['cores']} cores, "
        f"AVX2 {'yes' if m['avx2'] else 'no'}, AVX-512 {'yes' if m['avx512f'] else 'no'}); {m['note']}.",
        "",
        "| system | prompt | batch | TTFT s | decode tok/s | peak RSS GB | weights GB | KV B/token | "
        "greedy = transformers | precision ran | load avg | read GB/s before / after | weight MB/token | "
        "efficiency |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---|",
    ]
    for r in doc["aggregate"]:
        if not r.get("ok"):
            # the whole reason (it is one line, and says what to do); '|' would end the cell
            what = "not available" if r.get("not_available", True) else "failed"
            lines.append(f"| {r['system']} | {r['prompt_len']} | {r['batch']} | {what}: "
                         f"{str(r.get('error')).replace('|', '/')} | | | | | | | | | | |")
            continue
        a = r.get("agreement")
        agr = "reference" if r["system"] == "transformers" else (
            f"{a['tokens_matching']}/{a['tokens_total']}" if a else "-")
        rss = r.get("peak_rss_mb")
        rss_gb = {k: v / 1024 for k, v in rss.items() if k != "n"} | {"n": rss["n"]} if rss else None
        lines.append(f"| {r['system']} | {r['prompt_len']} | {r['batch']} | {_rng(r.get('ttft_s'), '.2f')} | "
                     f"{_rng(r.get('decode_tok_s'), '.1f')} | {_rng(rss_gb, '.1f')} | "
                     f"{_fmt(r['weight_bytes'] / 1e9 if r.get('weight_bytes') else None, '.2f')} | "
                     f"{_fmt(r.get('kv_bytes_per_token'), '.0f')} | {agr} | {r.get('inference_precision') or ''} | "
                     f"{'-'.join(format(x, '.1f') for x in r['loadavg_range']) if r.get('loadavg_range') else ''} | "
                     f"{_read_cell(r)} | "
                     f"{_fmt(r['weight_bytes_per_token'] / 1e6 if r.get('weight_bytes_per_token') else None, '.3f')} | "
                     f"{_efficiency_cell(r)} |")
    lines += ["",
              f"KV bytes per token ({kv['layers']} layers): ours {kv['latent_row_width']} x {kv['layers']} x the cache "
              f"dtype (one latent row per token and layer); a per-head expanded cache holds "
              f"{kv['expanded_values_per_layer']} values per layer (ratio "
              f"{kv['ratio_ours_vs_expanded_same_dtype']:.3f} at the same dtype). llama.cpp's figure is read from its "
              f"own log (llama_kv_cache size / cells), transformers' from its live cache, the others from their layout.",
              "",
              "efficiency = weight bytes a batch-1 decode token reads (MB/token: non-expert weights, one "
              "embedding row, top-k routed + shared experts, as stored) x decode tok/s / the plain multi-thread read's "
              "GB/s measured right before and after that run (their mean): the share of this moment's memory "
              "bandwidth the run streams its weights at; it compares rounds taken at different moments of a shared "
              "host, where tok/s alone follows the other tenants (docs/BENCHMARKS.md).",
              "",
              "TTFT = until every sequence of the batch has its first token. decode tok/s = batch / median "
              "full-batch decode step time (llama.cpp: llama-batched-bench's S_TG). Each system and grid point "
              "runs in its own process after a short warm-up, one at a time. load avg: the machine's 1-minute load "
              "average around the runs (2 cores: above 2 other jobs shared the cores)."]
    profs = [p for p in (doc.get("profile_ours_decode") or []) if p.get("ok") and "graph_shares" in p]
    if profs:
        parts = list(dict.fromkeys(k for p in profs for k in p["graph_shares"]))
        head = " | ".join(f"batch {p['batch']}: ms (share)" for p in profs)
        lines += ["", f"Where a decode step of {profs[0].get('system', 'ours')} goes (prompt {profs[0]['prompt_len']}; "
                      "OpenVINO PERF_COUNT per node over the full-batch decode steps, grouped by the node's weight):", "",
                  f"| part | {head} |", "|---|" + "---:|" * len(profs)]
        lines.append("| decode step (median) | " + " | ".join(
            f"{p['step_ms_median']:.1f} ms (infer {p['infer_ms_median']:.1f})" for p in profs) + " |")
        for k in parts:
            lines.append(f"| {k} | " + " | ".join(
                f"{p['graph_scaled_ms'].get(k, 0.0):.1f} ({100 * p['graph_shares'].get(k, 0.0):.0f} %)" for p in profs)
                + " |")
        lines.append("| Python (scheduler, metadata, sampling: step - infer) | " + " | ".join(
            f"{p['python_overhead_ms']:.1f}" for p in profs) + " |")
    lines += ["", "Summary: `" + json.dumps(doc["summary"]) + "`", ""]
    return "\n".join(lines)


def _read_cell(r: dict) -> str:
    b, a = r.get("read_gbps_before"), r.get("read_gbps_after")
    if not b and not a:
        return "-"
    return f"{_rng(b, '.1f')} / {_rng(a, '.1f')}"


def _efficiency_cell(r: dict) -> str:
    if r.get("efficiency"):
        return _rng(r["efficiency"], ".2f")
    why = r.get("efficiency_unknown")
    return f"not computed: {why}".replace("|", "/") if why else "-"


def efficiency_line(doc: dict) -> str:
    """The console's one line: each batch-1 row's median efficiency and the reads around it."""
    rows = [r for r in doc["aggregate"] if r.get("ok") and r["batch"] == 1]
    if "bandwidth" not in doc:
        return "efficiency: not measured (a record made before the read bandwidth was measured)"
    if doc["bandwidth"] is None:
        return "efficiency: not measured (--no-bandwidth)"
    if not rows:
        return "efficiency: no batch-1 run measured"
    parts = []
    for r in rows:
        where = f"{r['system']} p{r['prompt_len']}"
        if r.get("efficiency"):
            reads = [x for k in ("read_gbps_before", "read_gbps_after") for x in
                     ([r[k]["min"], r[k]["max"]] if r.get(k) else [])]
            parts.append(f"{where} {r['efficiency']['median']:.2f} ({r['decode_tok_s']['median']:.1f} tok/s x "
                         f"{r['weight_bytes_per_token'] / 1e6:.1f} MB at {min(reads):.1f}-{max(reads):.1f} GB/s)")
        else:
            parts.append(f"{where} not computed ({r.get('efficiency_unknown')})")
    return "efficiency (bytes/token x tok/s / plain read GB/s, batch 1): " + "; ".join(parts)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["aggregate"] if r.get("ok") and r.get("decode_tok_s")]
    batches = doc["workload"]["batches"]
    fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4), squeeze=False)
    for ax, b in zip(axes[0], batches):
        for system in dict.fromkeys(r["system"] for r in rows):
            pts = sorted((r["prompt_len"], r["decode_tok_s"]["median"]) for r in rows
                         if r["system"] == system and r["batch"] == b)
            if pts:
                ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (prompt tokens)")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"batch {b}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    c = doc["workload"]["model_config"]
    fig.suptitle(f"decode throughput, {c['num_hidden_layers']}-layer checkpoint (hidden {c['hidden_size']}), "
                 f"{doc['threads']} threads ({doc['machine']['cpu'][:40]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
