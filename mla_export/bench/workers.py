"""The benchmark's in-process workers, one grid point per process (so that each peak RSS is its own):
ours (an export directory through LLMEngine), transformers (the accuracy oracle, f32 eager) and the
decode-step profile of ours (the CPU plugin's per-node PERF_COUNT).

    python -m mla_export.bench.workers {ours,transformers,profile} --spec SPEC.json

prints `RESULT {json}` as its last stdout line (mla_export.bench.common.parse_result reads it)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from .common import current_rss_mb, decode_figures, peak_rss_mb, timed_generate, type_name


def worker_ours(spec: dict) -> dict:
    from mla_export.runtime import LLMEngine, SamplingParams

    prompts = json.load(open(spec["prompts_file"]))
    batch, new = len(prompts), spec["new_tokens"]
    plen = len(prompts[0])
    facts_cfg = json.load(open(Path(spec["export_dir"]) / "mla_graph.json"))
    bs = facts_cfg["cache"]["block_size"]
    need = batch * -(-(plen + new) // bs) + 8
    t0 = time.perf_counter()
    engine = LLMEngine(spec["export_dir"], precision=spec["precision"], num_threads=spec["threads"],
                       num_blocks=need, max_num_seqs=max(batch, 1),
                       max_num_batched_tokens=spec.get("max_batched_tokens", 2048), enable_prefix_caching=False)
    load_s = time.perf_counter() - t0
    load_rss = current_rss_mb()
    ex = engine.executor
    hint = type_name(ex.compiled.get_property("INFERENCE_PRECISION_HINT"))
    threads = ex.compiled.get_property("INFERENCE_NUM_THREADS")
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)

    def run(ps, tag):
        for i, p in enumerate(ps):
            engine.add_request(f"{tag}-{i}", p, params)
        t_start = time.perf_counter()
        steps = []  # (t_end, dt, rows produced, prefill rows in the step)
        first = {}
        tokens = {}
        while engine.has_unfinished_requests():
            ts = time.perf_counter()
            outs = engine.step()
            te = time.perf_counter()
            steps.append((te, te - ts, len(outs)))
            for o in outs:
                first.setdefault(o.request_id, te)
                tokens[o.request_id] = o.token_ids
        return t_start, steps, first, [tokens[f"{tag}-{i}"] for i in range(len(ps))]

    # warm-up: the same batch shape on short prompts (first-inference costs out of the figures)
    run([p[:16] for p in prompts], "warm")
    t_start, steps, first, tokens = run(prompts, "run")
    t_all_first = max(first.values())
    decode = [(dt, n) for te, dt, n in steps if te > t_all_first]
    res = {"ok": True, "load_s": load_s, "rss_after_load_mb": load_rss,
           "ttft_s": t_all_first - t_start, "ttft_first_seq_s": min(first.values()) - t_start,
           **decode_figures([d for d, _ in decode], [n for _, n in decode], batch),
           "e2e_s": steps[-1][0] - t_start, "tokens": tokens,
           "inference_precision": hint, "threads": int(threads) if threads else None,
           "kv_cache_dtype": facts_cfg["cache"]["dtype"],
           "kv_cache_bytes_allocated": int(sum(c.nbytes for c in engine.backend.kv_caches)),
           "weight_bytes": sum(f.stat().st_size for f in Path(spec["export_dir"]).glob("*.bin")),
           "max_num_batched_tokens": engine.scheduler.max_num_batched_tokens,
           "describe": ex.describe()}
    return res


def worker_transformers(spec: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    import transformers

    torch.set_num_threads(spec["threads"])
    prompts = json.load(open(spec["prompts_file"]))
    batch, new = len(prompts), spec["new_tokens"]
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    load_rss = current_rss_mb()
    gc = model.generation_config
    gc.eos_token_id = None  # EOS ignored, as for the other systems (no logits masking)
    gc.pad_token_id = 0

    def run(ids):
        with torch.inference_mode():
            return timed_generate(model, gc, ids, new, return_dict_in_generate=True)

    run([p[:16] for p in prompts])
    t_start, stamps, out = run(prompts)
    plen = len(prompts[0])
    seqs = out.sequences[:, plen:].tolist()
    dts = [b - a for a, b in zip(stamps, stamps[1:])]
    kv_bytes, kv_tokens = None, None
    pkv = getattr(out, "past_key_values", None)
    try:
        tensors = []
        for layer in pkv.layers:  # transformers 5 Cache
            tensors += [layer.keys, layer.values]
        kv_tokens = tensors[0].shape[0] * tensors[0].shape[-2]
        kv_bytes = sum(t.numel() * t.element_size() for t in tensors)
    except Exception:  # noqa: BLE001
        pass
    return {"ok": True, "load_s": load_s, "rss_after_load_mb": load_rss, "ttft_s": stamps[0] - t_start,
            **decode_figures(dts, [batch] * len(dts), batch), "e2e_s": stamps[-1] - t_start, "tokens": seqs,
            "inference_precision": "f32 (torch eager)", "threads": torch.get_num_threads(),
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "kv_cache_dtype": "f32",
            "kv_bytes_per_token_measured": kv_bytes / kv_tokens if kv_bytes else None}


# -------------------------------------------------------------------------------------------- profile
def worker_profile(spec: dict) -> dict:
    """Where a decode step of ours spends its time: OpenVINO per-node counters (PERF_COUNT),
    grouped into attention op / attention projections / MoE+MLP / lm_head / other graph nodes,
    and the Python side of a step (scheduler, metadata, sampling) = step wall time - infer."""

    from mla_export.ops.libraries import ov_core
    from mla_export.runtime import LLMEngine, SamplingParams

    core = ov_core()
    core.set_property("CPU", {"PERF_COUNT": True})
    prompts = json.load(open(spec["prompts_file"]))
    batch, new = len(prompts), spec["new_tokens"]
    plen = len(prompts[0])
    bs = json.load(open(Path(spec["export_dir"]) / "mla_graph.json"))["cache"]["block_size"]
    engine = LLMEngine(spec["export_dir"], precision=spec["precision"], num_threads=spec["threads"],
                       num_blocks=batch * -(-(plen + new) // bs) + 8, max_num_seqs=batch,
                       max_num_batched_tokens=spec.get("max_batched_tokens", 2048), enable_prefix_caching=False)
    ex = engine.executor
    # FullyConnected nodes are named Gemm_<n>: name them by their weight input instead
    weight_of = {}
    for op in ex.compiled.get_runtime_model().get_ordered_ops():
        if op.get_input_size() > 1:
            weight_of[op.get_friendly_name()] = op.input_value(1).get_node().get_friendly_name()
    orig_run = ex.run
    infer_times = []

    def timed_run():
        t = time.perf_counter()
        r = orig_run()
        infer_times.append(time.perf_counter() - t)
        return r

    ex.run = timed_run
    # The CPU plugin reports each node's AVERAGE over every inference of its request since
    # compilation (the start-up sentinel steps, the prefill chunks, ...): per-step times are
    # differences of average x number of inferences (exact for nodes that run at every
    # inference), summed over the executor's graphs (the dynamic one and the static decode
    # graphs, whose nodes have the same names). The sentinel step ran once on the dynamic graph
    # and once on the batch-1 static graph.
    graphs = ex.compiled_graphs
    static1 = ex.decode_graphs.decode_graph(1) if ex.decode_graphs is not None else None
    n_infer = {id(g.request): 1 if i == 0 or g is static1 else 0 for i, g in enumerate(graphs)}

    def cumulative():
        total: dict[tuple[str, str], float] = {}
        for g in graphs:
            for pi in g.request.profiling_info:
                key = (pi.node_name, pi.node_type)
                total[key] = total.get(key, 0.0) + pi.real_time.total_seconds() * 1e6 * n_infer[id(g.request)]
        return total

    def counted_run():
        n_infer[id(ex.request)] += 1  # the request of the step just bound
        return timed_run()

    ex.run = counted_run
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, params)
    # prefill until every request has its first token
    started = set()
    while len(started) < batch:
        for o in engine.step():
            started.add(o.request_id)
    groups: dict[str, float] = {}
    by_type: dict[str, float] = {}
    step_times, infer_dec = [], []
    n_prof = 0
    prev = cumulative()
    while engine.has_unfinished_requests():
        infer_times.clear()
        t = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t
        cur = cumulative()
        delta = {k: v - prev.get(k, 0.0) for k, v in cur.items()}
        prev = cur
        if len(outs) != batch:
            continue
        step_times.append(dt)
        infer_dec.append(sum(infer_times))
        n_prof += 1
        for (name, node_type), us in delta.items():
            if us <= 0:
                continue
            g = classify_node(name, node_type, weight_of.get(name, ""))
            groups[g] = groups.get(g, 0.0) + us
            by_type[node_type] = by_type.get(node_type, 0.0) + us
    step_ms = statistics.median(step_times) * 1e3
    infer_ms = statistics.median(infer_dec) * 1e3
    groups_ms = {k: v / n_prof / 1e3 for k, v in sorted(groups.items(), key=lambda kv: -kv[1])}
    node_sum = sum(groups_ms.values())
    # The node times are wall times of each node (on a loaded machine they include time the
    # threads were descheduled); scaled_ms = share x the measured infer time.
    shares = {k: v / node_sum for k, v in groups_ms.items()} if node_sum else {}
    return {"ok": True, "prompt_len": plen, "batch": batch, "decode_steps_profiled": n_prof,
            "step_ms_median": step_ms, "infer_ms_median": infer_ms,
            "python_overhead_ms": step_ms - infer_ms,
            "graph_nodes_ms_mean": groups_ms, "graph_nodes_sum_ms": node_sum, "graph_shares": shares,
            "graph_scaled_ms": {k: v * infer_ms for k, v in shares.items()},
            "by_node_type_ms_mean": {k: v / n_prof / 1e3 for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])[:15]},
            "inference_precision": type_name(ex.compiled.get_property("INFERENCE_PRECISION_HINT")),
            "note": "PERF_COUNT per-node real times of the decode steps (differences of the plugin's running "
                    "averages), grouped by the node's weight / op; graph_scaled_ms = share x infer_ms"}


def classify_node(name: str, node_type: str, weight: str = "") -> str:
    n, w = name.lower(), weight.lower()
    if ("paged_attention" in n or "paged_decode" in n or "cache_write" in n
            or node_type in ("MlaPagedAttention", "MlaCacheWrite")):
        return "attention op (MLA custom ops, incl. cache write)"
    if "lm_head" in w or n == "logits" or "lm_head" in n:
        return "lm_head"
    if "shared_experts" in w:
        return "MoE shared expert (FC)"
    # the fused MlaMoeExperts node is named <layer>.mlp.routed_experts (its input 1 is TopK's)
    if "experts" in w or "moe" in n or "routed_experts" in n:
        return "MoE routed experts"
    if ".mlp." in w:
        return "dense MLP (FC)" if "gate.weight" not in w else "MoE router"
    if "self_attn" in w:
        return "attention projections (FC: q, kv_a, o)"
    if node_type == "FullyConnected":
        return "other FC"
    return "other nodes (norms, rope, routing, gathers, ...)"


WORKERS = {"ours": worker_ours, "transformers": worker_transformers, "profile": worker_profile}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("worker", choices=sorted(WORKERS))
    ap.add_argument("--spec", required=True)
    a = ap.parse_args(argv)
    spec = json.loads(Path(a.spec).read_text())
    try:
        res = WORKERS[a.worker](spec)
    except Exception as e:  # noqa: BLE001  (reported, the parent keeps going)
        import traceback

        traceback.print_exc()
        res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    res["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
