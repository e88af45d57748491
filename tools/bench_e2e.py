#!/usr/bin/env python
"""End-to-end benchmark (issue 8): our exported graph with the paged latent cache against what
people run today on a CPU, on one checkpoint and one workload, measured side by side in one run.

Systems (each grid point of each system runs in its own subprocess, so its peak RSS is its own):
  ours-bf16, ours-f32  the `mla-export export` graph through `LLMEngine` (the engine under `LLM`)
                       with the paged latent cache: ours-bf16 = a bf16-cache export
                       (`--kv-dtype bf16`) with the bf16 precision hint, ours-f32 = an f32-cache
                       export with the f32 hint. The plugin's INFERENCE_PRECISION_HINT is read
                       back and reported: on a CPU without native bf16 it computes f32 either way.
  transformers         the same checkpoint with transformers' own `generate` (torch eager, f32,
                       torch.set_num_threads(threads)); the reference for greedy-token agreement.
  optimum              optimum-intel 2.2.0's OpenVINO export of the same checkpoint, route
                       `make_and_export.py export --mode native` (optimum-intel's exporter and
                       stateful cache, transformers' native DeepseekV3 attention kept: the stock
                       DeepSeek patch fails on the native classes), run with `OVModelForCausalLM`
                       in the optimum peer venv by tools/optimum_runner.py (JSON in, JSON out).
                       Marked "not available" with the reason when that venv is missing.

Workload: a DeepseekV3-architecture checkpoint with DeepSeek-V2-Lite's attention shape (16 heads,
kv_lora_rank 512, rope 64, nope 128, v 128, hidden 2048, YaRN as V2-Lite), few layers and a small
MoE, random weights from a fixed seed, saved with transformers; random prompts (fixed seed) of
128/1024/4096 tokens, batch 1 and 8, 64 new tokens, greedy, EOS ignored.

Figures per (system, prompt length, batch): time to first token (until every sequence of the
batch has its first token), decode tokens/s (median over full-batch decode steps: batch / median
step time; the mean over the decode phase is kept too), peak RSS, KV cache bytes per token (from
the configs, and measured from the live cache where the system exposes it), greedy agreement with
transformers.

    python tools/bench_e2e.py --quick          # one prompt length, batch 1 and 8 (< 15 min here)
    python tools/bench_e2e.py                  # the full grid
    python tools/bench_e2e.py --profile        # also: where a decode step of ours spends its time
    mla-export bench ...                       # the same
    python tools/bench_e2e.py --render bench_results/e2e.json   # re-write the table and plot

Memory: transformers' prefill of 8 x 4096 tokens peaked at ~22.6 GB RSS here (its SDPA with a mask
materialises the attention scores), optimum's at ~16.6 GB (logits for every prompt position):
on a shared 23 GB machine run the 4096 x 8 point when nothing else is big.
The full grid took ~31 min here (transformers at 4096 x 8 alone ~12 min); --quick ~11 min.

Outputs: bench_results/e2e.json, bench_results/e2e.md, bench_results/e2e_decode.png; the last
stdout line is a one-line JSON summary with the ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OPTIMUM_PEER_DIR = Path(os.environ.get("MLA_OPTIMUM_PEER", Path.home() / ".cache/mla-peers/optimum"))
MAKE_AND_EXPORT = Path(os.environ.get("MLA_OPTIMUM_SCRIPT", REPO.parent / "shared/peers/optimum/make_and_export.py"))
ALL_SYSTEMS = ("ours-bf16", "ours-f32", "transformers", "optimum")
SCHEMA_VERSION = 1

# DeepSeek-V2-Lite's attention shape and rope; few layers (layer 0 dense, the rest MoE), a small MoE.
V2LITE_SHAPE = dict(
    vocab_size=32000, hidden_size=2048, intermediate_size=2816, moe_intermediate_size=1408,
    num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
    qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=8, n_shared_experts=1,
    num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=1.0,
    norm_topk_prob=False, max_position_embeddings=163840, initializer_range=0.03,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                         beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707),
)
# For the smoke test: the same structure, tiny.
TINY_SHAPE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None,
    qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=24, n_routed_experts=4, n_shared_experts=1,
    num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=1.0,
    norm_topk_prob=False, max_position_embeddings=4096, initializer_range=0.08,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=1024,
                         beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707),
)
SHAPES = {"v2lite": V2LITE_SHAPE, "tiny": TINY_SHAPE}


def log(msg: str) -> None:
    print(f"[bench_e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def type_name(v) -> str:
    """An OpenVINO property value as a short name ("f32", "bf16", ...)."""
    return v.get_type_name() if hasattr(v, "get_type_name") else str(v)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def current_rss_mb() -> float:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


# ------------------------------------------------------------------------------------------ step timing helpers
def decode_figures(step_times: list[float], step_rows: list[int], batch: int) -> dict:
    """step_times: wall time of each decode step (seconds); step_rows: tokens it produced.
    Headline: batch / median step time over the steps that produced a token for every sequence."""
    full = [t for t, n in zip(step_times, step_rows) if n == batch]
    out = {"decode_steps": len(step_times), "decode_full_batch_steps": len(full)}
    if full:
        med = statistics.median(full)
        out["step_ms_median"] = med * 1e3
        out["decode_tok_s"] = batch / med
    if step_times:
        out["decode_tok_s_mean"] = sum(step_rows) / sum(step_times)
    return out


# ------------------------------------------------------------------------------------------------ workers
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
           "kv_cache_bytes_allocated": int(sum(c.nbytes for c in engine.kv_cache.kv_caches)),
           "max_num_batched_tokens": engine.scheduler.max_num_batched_tokens,
           "describe": ex.describe()}
    return res


def worker_transformers(spec: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList
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

    class Stamp(LogitsProcessor):
        def __init__(self):
            self.t = []

        def __call__(self, input_ids, scores):
            self.t.append(time.perf_counter())
            return scores

    def run(ids):
        stamp = Stamp()
        x = torch.tensor(ids, dtype=torch.long)
        t_start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                 do_sample=False, num_beams=1, generation_config=gc,
                                 logits_processor=LogitsProcessorList([stamp]), return_dict_in_generate=True)
        return t_start, stamp.t, out

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


def run_worker(args) -> int:
    spec = json.loads(Path(args.spec).read_text())
    fn = {"ours": worker_ours, "transformers": worker_transformers, "profile": worker_profile}[args.worker]
    try:
        res = fn(spec)
    except Exception as e:  # noqa: BLE001  (reported, the parent keeps going)
        import traceback

        traceback.print_exc()
        res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    res["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(res), flush=True)
    return 0


# -------------------------------------------------------------------------------------------- profile
def worker_profile(spec: dict) -> dict:
    """Where a decode step of ours spends its time: OpenVINO per-node counters (PERF_COUNT),
    grouped into attention op / attention projections / MoE+MLP / lm_head / other graph nodes,
    and the Python side of a step (scheduler, metadata, sampling) = step wall time - infer."""
    import numpy as np

    from mla_export import ov_core
    from mla_export.runtime import LLMEngine, SamplingParams

    core = ov_core()
    core.set_property("CPU", {"PERF_COUNT": True})
    prompts = json.load(open(spec["prompts_file"]))
    batch, new = len(prompts), spec["new_tokens"]
    plen = len(prompts[0])
    engine = LLMEngine(spec["export_dir"], precision=spec["precision"], num_threads=spec["threads"],
                       num_blocks=batch * -(-(plen + new) // 16) + 8, max_num_seqs=batch,
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
    # The CPU plugin reports each node's AVERAGE over every inference since compilation (the
    # start-up sentinel step, the prefill chunks, ...): per-step times are differences of
    # average x number of inferences (exact for nodes that run at every inference).
    n_infer = [1]  # the executor's start-up sentinel step

    def cumulative():
        return {(pi.node_name, pi.node_type): pi.real_time.total_seconds() * 1e6 * n_infer[0]
                for pi in ex.request.profiling_info}

    def counted_run():
        n_infer[0] += 1
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
            or node_type in ("MlaPagedAttention", "MlaPagedDecode", "MlaCacheWrite")):
        return "attention op (MLA custom ops, incl. cache write)"
    if "lm_head" in w or n == "logits" or "lm_head" in n:
        return "lm_head"
    if "experts." in w:
        return "MoE routed experts (FC)"
    if "shared_experts" in w:
        return "MoE shared expert (FC)"
    if ".mlp." in w:
        return "dense MLP (FC)" if "gate.weight" not in w else "MoE router"
    if "self_attn" in w:
        return "attention projections (FC: q, kv_a, o)"
    if node_type == "FullyConnected":
        return "other FC"
    return "other nodes (norms, rope, routing, gathers, ...)"


# ----------------------------------------------------------------------------------------- orchestration
def checkpoint_config(shape: str, layers: int) -> dict:
    cfg = dict(SHAPES[shape])
    cfg["num_hidden_layers"] = layers
    return cfg


def make_bench_checkpoint(model_dir: Path, cfg: dict, seed: int) -> None:
    """Random weights from a fixed seed with transformers' DeepseekV3 classes (mla_export.presets),
    plus the legacy rope keys (rope_theta, rope_scaling) so that transformers 4.53 (the optimum
    peer) reads the same rope as transformers 5."""
    from mla_export.presets import make_checkpoint

    tmp = model_dir.with_name(model_dir.name + ".tmp")
    make_checkpoint(tmp, "deepseek_v3", seed=seed, tokenizer=False, **cfg)
    p = tmp / "config.json"
    c = json.loads(p.read_text())
    rp = dict(c.get("rope_parameters") or cfg["rope_parameters"])
    c["rope_theta"] = rp.pop("rope_theta", 10000.0)
    if rp.get("rope_type", "default") != "default":
        c["rope_scaling"] = {**rp, "type": rp["rope_type"]}
    p.write_text(json.dumps(c, indent=2) + "\n")
    tmp.rename(model_dir)


def sh(cmd: list[str], timeout: float | None = None, env: dict | None = None) -> tuple[int, str, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return -9, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), f"timeout after {timeout} s"


def parse_result(rc: int, out: str, err: str) -> dict:
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = " | ".join(err.strip().splitlines()[-3:])
    return {"ok": False, "error": f"exit {rc}: {tail[-600:]}"}


def optimum_python(args) -> tuple[str | None, str | None]:
    """(python, None) when the optimum peer env is usable, else (None, reason)."""
    py = Path(args.optimum_python) if args.optimum_python else OPTIMUM_PEER_DIR / "venv/bin/python"
    if not py.exists():
        return None, (f"optimum peer env not found ({py}); build it with "
                      f"bash ../shared/peers/optimum/setup_optimum_peer.sh")
    if not MAKE_AND_EXPORT.exists():
        return None, f"{MAKE_AND_EXPORT} not found"
    rc, out, err = sh([str(py), "-c", "import optimum.intel, openvino, transformers; print(transformers.__version__)"],
                      timeout=300)
    if rc != 0:
        return None, f"optimum peer env broken: {err.strip().splitlines()[-1] if err.strip() else rc}"
    return str(py), None


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


def type_bytes(name: str | None) -> int | None:
    if not name:
        return None
    n = name.lower()
    for k, b in (("f32", 4), ("float32", 4), ("bf16", 2), ("bfloat16", 2), ("f16", 2), ("float16", 2), ("u8", 1),
                 ("i8", 1)):
        if k in n:
            return b
    return None


def run_bench(args) -> int:
    t_run0 = time.time()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in ALL_SYSTEMS:
            print(f"bench_e2e: unknown system {s!r} (choose from {', '.join(ALL_SYSTEMS)})", file=sys.stderr)
            return 2
    prompt_lens = [int(x) for x in str(args.prompt_lens).split(",")]
    batches = [int(x) for x in str(args.batches).split(",")]
    if args.quick:
        prompt_lens = [int(args.quick_prompt_len)]
    cfg = checkpoint_config(args.shape, args.layers)
    key = hashlib.sha1(json.dumps([cfg, args.seed], sort_keys=True).encode()).hexdigest()[:10]
    model_dir = work / f"ckpt-{args.shape}-L{args.layers}-s{args.seed}-{key}"
    ours_dirs = {kv: work / f"ours-{kv}kv-{model_dir.name}" for kv in ("bf16", "f32")}
    opt_dir = work / f"optimum-native-{model_dir.name}"
    py = sys.executable
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=str(args.threads))
    prep = {}
    if not model_dir.exists():
        log(f"making checkpoint {model_dir}")
        t = time.time()
        rc, o, e = sh([py, __file__, "--make-checkpoint", str(model_dir), "--shape", args.shape,
                       "--layers", str(args.layers), "--seed", str(args.seed)], env=env)
        if rc != 0:
            print(e, file=sys.stderr)
            return 1
        prep["checkpoint_s"] = time.time() - t
    for kv_dtype, ours_dir in ours_dirs.items():
        if f"ours-{kv_dtype}" not in systems and not (kv_dtype == "f32" and args.profile):
            continue
        if (ours_dir / "mla_graph.json").exists():
            continue
        log(f"exporting ours ({kv_dtype} cache) -> {ours_dir}")
        t = time.time()
        rc, o, e = sh([py, "-m", "mla_export.cli", "export", str(model_dir), "-o", str(ours_dir), "--overwrite", "-q",
                       "--kv-dtype", kv_dtype], env=env)
        if rc != 0:
            print(o, e, file=sys.stderr)
            return 1
        prep[f"ours_{kv_dtype}_export_s"] = time.time() - t
    opt_py, opt_reason = (None, "not requested")
    if "optimum" in systems:
        opt_py, opt_reason = optimum_python(args)
        if opt_py and not (opt_dir / "openvino_model.xml").exists():
            log(f"exporting optimum-intel (native route) -> {opt_dir}")
            t = time.time()
            rc, o, e = sh([opt_py, str(MAKE_AND_EXPORT), "export", "--model", str(model_dir), "--out", str(opt_dir),
                           "--mode", "native", "--weight-format", "fp32"], env=env)
            r = parse_result(rc, o, e)
            if rc != 0 or r.get("error"):
                opt_py, opt_reason = None, f"optimum-intel export failed: {r.get('error')}"
            else:
                prep["optimum_export_s"] = time.time() - t
    model_cfg = json.loads((model_dir / "config.json").read_text())

    results = []
    grid = [(p, b) for p in prompt_lens for b in batches]
    import random

    for plen, batch in grid:
        rng = random.Random(args.seed * 7919 + plen * 31 + batch)
        prompts = [[rng.randrange(3, model_cfg["vocab_size"]) for _ in range(plen)] for _ in range(batch)]
        pf = work / f"prompts-{plen}x{batch}-s{args.seed}.json"
        pf.write_text(json.dumps(prompts))
        for system in systems:
            spec = {"model_dir": str(model_dir), "optimum_dir": str(opt_dir),
                    "prompts_file": str(pf), "new_tokens": args.new_tokens, "threads": args.threads,
                    "max_batched_tokens": args.max_batched_tokens}
            if system.startswith("ours"):
                spec["precision"] = system.split("-")[1]
                spec["export_dir"] = str(ours_dirs[spec["precision"]])
                cmd = [py, __file__, "--worker", "ours"]
            elif system == "transformers":
                cmd = [py, __file__, "--worker", "transformers"]
            else:
                if opt_py is None:
                    results.append({"system": system, "prompt_len": plen, "batch": batch, "ok": False,
                                    "not_available": opt_reason})
                    continue
                spec["kv_cache_precision"] = args.optimum_kv_precision
                cmd = [opt_py, str(HERE / "optimum_runner.py")]
            sf = work / f"spec-{system}-{plen}x{batch}.json"
            sf.write_text(json.dumps(spec))
            log(f"{system}: prompt {plen} x batch {batch}, {args.new_tokens} new tokens")
            t = time.time()
            rc, o, e = sh(cmd + ["--spec", str(sf)], timeout=args.timeout, env=env)
            r = parse_result(rc, o, e)
            r.update(system=system, prompt_len=plen, batch=batch, wall_s=time.time() - t)
            if not r.get("ok"):
                log(f"  {system} failed: {r.get('error')}")
            else:
                log(f"  ttft {r['ttft_s']:.2f} s, decode {r.get('decode_tok_s', float('nan')):.1f} tok/s, "
                    f"peak RSS {r['peak_rss_mb']:.0f} MB ({r['wall_s']:.0f} s)")
            results.append(r)

    # greedy agreement with transformers (f32), per grid point
    ref = {(r["prompt_len"], r["batch"]): r["tokens"] for r in results if r["system"] == "transformers" and r.get("ok")}
    for r in results:
        toks, rt = r.get("tokens"), ref.get((r["prompt_len"], r["batch"]))
        if r["system"] == "transformers" or not r.get("ok"):
            continue
        if toks is None or rt is None:
            r["agreement"] = None
            continue
        r["agreement"] = agreement(toks, rt)

    ours_bytes = 2 if "ours-bf16" in systems else 4
    opt_kv = next((r.get("kv_cache_precision") for r in results if r["system"] == "optimum" and r.get("ok")), None)
    hf_kv = next((r.get("kv_bytes_per_token_measured") for r in results if r["system"] == "transformers" and r.get("ok")),
                 None)
    kv = kv_figures(model_cfg, ours_bytes, type_bytes(opt_kv), hf_kv)
    kv["optimum_kv_cache_precision"] = opt_kv
    kv["optimum_bytes_per_token_measured"] = next(
        (r.get("kv_bytes_per_token_measured") for r in results if r["system"] == "optimum" and r.get("ok")), None)
    kv["optimum_values_per_token_per_layer_measured"] = next(
        (r["kv_states"].get("values_per_token_per_layer_measured") for r in results
         if r["system"] == "optimum" and r.get("ok") and isinstance(r.get("kv_states"), dict)), None)

    profile = []  # one per batch size, at the longest prompt
    if args.profile and any(s.startswith("ours") for s in systems):
        plen = prompt_lens[-1]
        for batch in batches:
            pf = work / f"prompts-{plen}x{batch}-s{args.seed}.json"
            spec = {"export_dir": str(ours_dirs["f32"]), "prompts_file": str(pf), "new_tokens": args.new_tokens,
                    "threads": args.threads, "precision": "f32", "max_batched_tokens": args.max_batched_tokens}
            sf = work / f"spec-profile-{plen}x{batch}.json"
            sf.write_text(json.dumps(spec))
            log(f"profiling the decode steps of ours (f32) at prompt {plen} x batch {batch}")
            rc, o, e = sh([py, __file__, "--worker", "profile", "--spec", str(sf)], timeout=args.timeout, env=env)
            profile.append(parse_result(rc, o, e))

    doc = {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "quick": bool(args.quick),
        "machine": machine_info(),
        "threads": args.threads,
        "workload": {"shape": args.shape, "model_config": {k: model_cfg.get(k) for k in (
            "num_hidden_layers", "hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank",
            "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "vocab_size", "n_routed_experts",
            "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "intermediate_size",
            "first_k_dense_replace", "rope_scaling")},
                     "seed": args.seed, "prompt_lens": prompt_lens, "batches": batches,
                     "new_tokens": args.new_tokens, "sampling": "greedy, EOS ignored",
                     "checkpoint": str(model_dir)},
        "systems": {
            "ours-bf16": "mla-export IR, bf16 latent cache (the default export), via LLMEngine, precision hint bf16",
            "ours-f32": "mla-export IR, f32 latent cache (--kv-dtype f32), via LLMEngine, precision hint f32",
            "transformers": "transformers generate, torch eager f32 (the agreement reference)",
            "optimum": ("optimum-intel 2.2.0 OpenVINO export, route make_and_export.py export --mode native "
                        "(native DeepseekV3 attention, stateful cache), OVModelForCausalLM with its default "
                        "CPU config + INFERENCE_NUM_THREADS" if opt_py else f"not available: {opt_reason}"),
        },
        "prep_s": prep,
        "kv_cache": kv,
        "results": results,
        "profile_ours_decode": profile,
    }
    doc["summary"] = summary(doc)
    doc["total_s"] = time.time() - t_run0
    (out_dir / "e2e.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "e2e.md").write_text(markdown(doc))
    try:
        plot(doc, out_dir / "e2e_decode.png")
    except Exception as e:  # noqa: BLE001  (matplotlib missing: JSON and table still written)
        log(f"no plot: {type(e).__name__}: {e}")
    log(f"wrote {out_dir / 'e2e.json'}, {out_dir / 'e2e.md'}, {out_dir / 'e2e_decode.png'} in {doc['total_s']:.0f} s")
    print(markdown(doc))
    print(json.dumps(doc["summary"]))
    return 0


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
            "sequences_identical": identical, "sequences": len(ref),
            "first_divergence": first_div}


def machine_info() -> dict:
    flags = ""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": os.cpu_count(), "avx2": " avx2" in flags, "avx512f": " avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags, "python": platform.python_version(),
            "note": "shared machine: other jobs were running; timings are noisy, compare the ratios within this run"}


def _get(results, system, plen, batch):
    return next((r for r in results if r["system"] == system and r["prompt_len"] == plen and r["batch"] == batch), None)


def summary(doc: dict) -> dict:
    res = doc["results"]
    plens, batches = doc["workload"]["prompt_lens"], doc["workload"]["batches"]
    P, B = max(plens), max(batches)
    s = {"ctx": P, "batch": B}
    ours = {sys_: _get(res, sys_, P, B) for sys_ in ("ours-bf16", "ours-f32")}
    best = max((r for r in ours.values() if r and r.get("ok") and r.get("decode_tok_s")),
               key=lambda r: r["decode_tok_s"], default=None)
    hf, opt = _get(res, "transformers", P, B), _get(res, "optimum", P, B)
    if best:
        s["ours_system"] = best["system"]
        s["ours_decode_tok_s"] = round(best["decode_tok_s"], 2)
        s["ours_precision_ran"] = best.get("inference_precision")
    for name, r in (("transformers", hf), ("optimum", opt)):
        if r and r.get("ok") and best:
            s[f"{name}_decode_tok_s"] = round(r["decode_tok_s"], 2)
            s[f"decode_ratio_vs_{name}"] = round(best["decode_tok_s"] / r["decode_tok_s"], 2)
            s[f"ttft_ratio_{name}_over_ours"] = round(r["ttft_s"] / best["ttft_s"], 2)
        elif r is not None and not r.get("ok"):
            s[f"decode_ratio_vs_{name}"] = "not available: " + str(r.get("not_available") or r.get("error"))[:160]
    agr = [r["agreement"] for r in res if r["system"] == "ours-f32" and r.get("agreement")]
    if agr:
        s["greedy_agreement_ours_f32"] = f"{sum(a['tokens_matching'] for a in agr)}/{sum(a['tokens_total'] for a in agr)}"
    agr = [r["agreement"] for r in res if r["system"] == "ours-bf16" and r.get("agreement")]
    if agr:
        s["greedy_agreement_ours_bf16"] = f"{sum(a['tokens_matching'] for a in agr)}/{sum(a['tokens_total'] for a in agr)}"
    agr = [r["agreement"] for r in res if r["system"] == "optimum" and r.get("agreement")]
    if agr:
        s["greedy_agreement_optimum"] = f"{sum(a['tokens_matching'] for a in agr)}/{sum(a['tokens_total'] for a in agr)}"
    kv = doc["kv_cache"]
    s["kv_bytes_ratio_ours_vs_optimum"] = round(kv["ratio_ours_vs_optimum"], 4) if kv.get("ratio_ours_vs_optimum") else None
    s["kv_bytes_ratio_ours_vs_expanded_same_dtype"] = round(kv["ratio_ours_vs_expanded_same_dtype"], 4)
    s["kv_bytes_ratio_ours_vs_transformers"] = (round(kv["ratio_ours_vs_transformers"], 4)
                                                if kv.get("ratio_ours_vs_transformers") else None)
    return s


def _fmt(x, spec=".2f", na="-"):
    if x is None:
        return na
    try:
        return format(x, spec)
    except (TypeError, ValueError):
        return str(x)


def markdown(doc: dict) -> str:
    m, w, kv = doc["machine"], doc["workload"], doc["kv_cache"]
    c = w["model_config"]
    lines = [
        f"### End-to-end: ours vs transformers vs optimum-intel ({'quick' if doc['quick'] else 'full'} grid)",
        "",
        f"Checkpoint: DeepseekV3 architecture, DeepSeek-V2-Lite attention shape ({c['num_attention_heads']} heads, "
        f"kv_lora_rank {c['kv_lora_rank']}, rope {c['qk_rope_head_dim']}, nope {c['qk_nope_head_dim']}, "
        f"v {c['v_head_dim']}, hidden {c['hidden_size']}), {c['num_hidden_layers']} layers "
        f"(first {c['first_k_dense_replace']} dense), MoE {c['n_routed_experts']} experts top-{c['num_experts_per_tok']} "
        f"+ {c['n_shared_experts']} shared, vocab {c['vocab_size']}, random weights (seed {w['seed']}). "
        f"{w['new_tokens']} new tokens, greedy. {doc['threads']} threads. CPU: {m['cpu']} ({m['cores']} cores, "
        f"AVX2 {'yes' if m['avx2'] else 'no'}, AVX-512 {'yes' if m['avx512f'] else 'no'}, native bf16 "
        f"{'yes' if (m['avx512_bf16'] or m['amx_bf16']) else 'no'}); {m['note']}.",
        "",
        "| system | prompt | batch | TTFT s | decode tok/s | decode tok/s (mean) | peak RSS MB | KV B/token | greedy = transformers | precision ran |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    kvb = {"ours-bf16": kv["layers"] * kv["latent_row_width"] * 2, "ours-f32": kv["layers"] * kv["latent_row_width"] * 4,
           "transformers": kv["transformers_bytes_per_token"], "optimum": kv["optimum_bytes_per_token"]}
    for r in doc["results"]:
        if not r.get("ok"):
            why = r.get("not_available") or r.get("error")
            lines.append(f"| {r['system']} | {r['prompt_len']} | {r['batch']} | not available: {str(why)[:120]} "
                         "| | | | | | |")
            continue
        a = r.get("agreement")
        agr = "reference" if r["system"] == "transformers" else (
            f"{a['tokens_matching']}/{a['tokens_total']}" if a else "-")
        prec = r.get("inference_precision", "")
        if r["system"] == "optimum":
            prec = f"{prec}, KV {r.get('kv_cache_precision')}"
        lines.append(f"| {r['system']} | {r['prompt_len']} | {r['batch']} | {_fmt(r.get('ttft_s'))} | "
                     f"{_fmt(r.get('decode_tok_s'), '.1f')} | {_fmt(r.get('decode_tok_s_mean'), '.1f')} | "
                     f"{_fmt(r.get('peak_rss_mb'), '.0f')} | {_fmt(kvb.get(r['system']), 'd')} | {agr} | {prec} |")
    lines += ["",
              f"KV cache bytes per token ({kv['layers']} layers): ours {kv['ours_bytes_per_token']} "
              f"({kv['latent_row_width']} x {kv['layers']} x {kv['ours_dtype_bytes']} B) vs the per-head expanded "
              f"layout {kv['expanded_values_per_layer']} values per layer: optimum "
              f"{_fmt(kv['optimum_bytes_per_token'], 'd', 'n/a')} (its KV precision {kv.get('optimum_kv_cache_precision')}), "
              f"transformers {_fmt(kv['transformers_bytes_per_token'], 'd', 'n/a')} (measured: transformers 5 keeps "
              f"the compressed latent in f32 and re-expands the whole context with kv_b_proj every step); "
              f"ratio ours/expanded at the same dtype "
              f"{kv['ratio_ours_vs_expanded_same_dtype']:.3f} (1/{1 / kv['ratio_ours_vs_expanded_same_dtype']:.1f}).",
              "",
              "TTFT = until every sequence of the batch has its first token. decode tok/s = batch / median "
              "full-batch decode step time (the mean column: all decode-phase tokens / decode time). "
              "Each system and grid point runs in its own process after a short warm-up."]
    profs = doc.get("profile_ours_decode") or []
    profs = [p for p in (profs if isinstance(profs, list) else [profs]) if p.get("ok") and "graph_shares" in p]
    if profs:
        parts = list(dict.fromkeys(k for p in profs for k in p["graph_shares"]))
        head = " | ".join(f"batch {p['batch']}: ms (share)" for p in profs)
        lines += ["", f"Where a decode step of ours goes (f32 cache, prompt {profs[0]['prompt_len']}; OpenVINO "
                      "PERF_COUNT per node over the full-batch decode steps, grouped by the node's weight):", "",
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


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = [r for r in doc["results"] if r.get("ok") and r.get("decode_tok_s")]
    batches = doc["workload"]["batches"]
    fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4), squeeze=False)
    for ax, b in zip(axes[0], batches):
        for system in ALL_SYSTEMS:
            pts = sorted((r["prompt_len"], r["decode_tok_s"]) for r in res if r["system"] == system and r["batch"] == b)
            if pts:
                ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (prompt tokens)")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"batch {b}")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"decode throughput, {doc['workload']['model_config']['num_hidden_layers']}-layer V2-Lite-shaped "
                 f"model, {doc['threads']} threads ({doc['machine']['cpu'][:40]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--quick", action="store_true", help="reduced grid: one prompt length (--quick-prompt-len), batch 1 and 8")
    p.add_argument("--quick-prompt-len", type=int, default=1024)
    p.add_argument("--prompt-lens", default="128,1024,4096")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2, help="number of decoder layers (layer 0 dense, the rest MoE)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="v2lite")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--systems", default=",".join(ALL_SYSTEMS))
    p.add_argument("--max-batched-tokens", type=int, default=2048, help="our scheduler's token budget per step")
    p.add_argument("--optimum-python", default=None, help="python of the optimum peer venv")
    p.add_argument("--optimum-kv-precision", default=None, help="KV_CACHE_PRECISION for optimum (default: plugin's)")
    p.add_argument("--profile", action="store_true", help="profile a decode step of ours (largest grid point)")
    p.add_argument("--out-dir", default=str(REPO / "bench_results"))
    p.add_argument("--work-dir", default=str(Path.home() / ".cache/mla-export-bench"),
                   help="checkpoint and exports (reused between runs)")
    p.add_argument("--timeout", type=float, default=3600.0, help="per worker process, seconds")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        wp = argparse.ArgumentParser()
        wp.add_argument("--worker", required=True)
        wp.add_argument("--spec", required=True)
        return run_worker(wp.parse_args(argv))
    if argv[:1] == ["--make-checkpoint"]:
        mp = argparse.ArgumentParser()
        mp.add_argument("--make-checkpoint", required=True)
        mp.add_argument("--shape", default="v2lite")
        mp.add_argument("--layers", type=int, default=2)
        mp.add_argument("--seed", type=int, default=0)
        a = mp.parse_args(argv)
        make_bench_checkpoint(Path(a.make_checkpoint), checkpoint_config(a.shape, a.layers), a.seed)
        return 0
    if argv[:1] == ["--render"]:  # re-write e2e.md and e2e_decode.png from an e2e.json
        path = Path(argv[1])
        doc = json.loads(path.read_text())
        doc["summary"] = summary(doc)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        path.with_name("e2e.md").write_text(markdown(doc))
        plot(doc, path.with_name("e2e_decode.png"))
        print(markdown(doc))
        print(json.dumps(doc["summary"]))
        return 0
    p = add_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    return run_bench(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
