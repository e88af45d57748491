"""`mla-export bench quality`: the KL divergence of quantised systems from their own 16-bit base
on one checkpoint and one text, ours beside llama.cpp's and ik_llama.cpp's (quality.py says how).

    mla-export bench quality --checkpoint CKPT --text FILE --systems ours-int8,ours-int4,ik-Q8_0,ik-Q4_K_M

Ours: the base is `ours-bf16` (bf16 weights) at the f32 hint; each ours-* system runs at --precision
(default bf16, what users run). Peers (llamacpp-<TYPE>, ik-<TYPE>): their `llama-perplexity` on
their BF16 GGUF (the base) and on the TYPE GGUF, made by their own converter and quantizer, ik with
its DeepSeek flags. Exports and GGUFs are kept in --work-dir (shared with `mla-export bench`).
Writes quality.json and quality.md in --out-dir; exits 1 when nothing was measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from . import peers
from .common import error_tail, log, machine_info, sh
from .quality import our_kld, parse_llama_perplexity
from .run import OURS_WEIGHTS, _export_cmd, system_kind

BASE = "ours-bf16"


def add_arguments(p) -> None:
    p.add_argument("--checkpoint", required=True, help="the checkpoint directory every system is made from")
    p.add_argument("--text", required=True, help="a UTF-8 text file long enough for --chunks chunks of --ctx tokens")
    p.add_argument("--systems", default="ours-int8,ours-int4,ik-Q8_0,ik-Q4_K_M",
                   help="comma list of ours-<FORMAT>, llamacpp-<TYPE>, ik-<TYPE> (bases are added)")
    p.add_argument("--ctx", type=int, default=512, help="tokens a chunk (llama-perplexity's -c; default 512)")
    p.add_argument("--chunks", type=int, default=8, help="chunks of the text to score (default 8)")
    p.add_argument("--precision", default="bf16", choices=("bf16", "f32"),
                   help="the hint ours-* systems run at (the base runs at f32)")
    p.add_argument("--runtime", default="openvino", choices=("openvino", "onnxruntime"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--export-args", default="",
                   help="extra `mla-export export` options for the ours-* systems (not the base), e.g. '--group-size 32'")
    p.add_argument("--reexport", action="store_true", help="export ours again even if the work dir has it")
    p.add_argument("--llamacpp-dir", default=None, help="llama.cpp peer dir (default ~/.cache/mla-peers/llamacpp)")
    p.add_argument("--ik-dir", default=None, help="ik_llama.cpp peer dir (default ~/.cache/mla-peers/ik_llamacpp)")
    p.add_argument("--out-dir", default=str(Path.cwd() / "bench_results"))
    p.add_argument("--work-dir", default=str(Path.home() / ".cache/mla-export-bench"))
    p.add_argument("--timeout", type=float, default=3600.0, help="per export / peer run, seconds")


def _systems(text: str) -> list[str]:
    systems = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in systems if system_kind(s) not in ("ours", "llamacpp", "ik") or s == "ours"]
    if bad or not systems:
        raise ValueError(f"--systems: {', '.join(bad) or 'empty'}: bench quality takes ours-<FORMAT> "
                         f"({', '.join(OURS_WEIGHTS)}), llamacpp-<TYPE> and ik-<TYPE>")
    return systems


def _check_args(args) -> None:
    ckpt = Path(args.checkpoint)
    if not (ckpt / "config.json").is_file():
        raise ValueError(f"--checkpoint {ckpt}: no config.json there")
    if not Path(args.text).is_file():
        raise ValueError(f"--text {args.text}: no such file")
    for name in ("ctx", "chunks", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be positive, got {getattr(args, name)}")
    if args.ctx < 8:
        raise ValueError(f"--ctx must be at least 8 tokens, got {args.ctx}")


def _export(system: str, ckpt: Path, work: Path, args, env: dict) -> tuple[Path | None, str]:
    # --export-args change what an export holds: such exports get their own directory
    extra = args.export_args.strip() if system != BASE else ""
    suffix = "-x" + hashlib.sha256(extra.encode()).hexdigest()[:8] if extra else ""
    d = work / f"{system}-{ckpt.name}{suffix}"
    if (d / "mla_graph.json").exists() and not args.reexport:
        return d, ""
    cmd = _export_cmd(system, ckpt, d, True, extra, sys.executable)
    if isinstance(cmd, str):
        return None, cmd
    log(f"exporting {system} -> {d}")
    rc, o, e = sh(cmd, env=env, timeout=args.timeout)
    return (d, "") if rc == 0 else (None, f"export failed: {error_tail(o + e)}")


def _ours(systems: list[str], ckpt: Path, work: Path, args, env: dict, results: dict, unavailable: dict) -> None:
    ours = [s for s in systems if system_kind(s) == "ours"]
    if not ours:
        return
    base, why = _export(BASE, ckpt, work, args, env)
    if base is None:
        for s in ours:
            unavailable[s] = f"the base {BASE}: {why}"
        return
    dirs = {}
    for s in ours:
        d, why = _export(s, ckpt, work, args, env)
        if d is None:
            unavailable[s] = why
        else:
            dirs[s] = d
    if dirs:
        log(f"ours: {', '.join(dirs)} against {BASE} (f32 hint), {args.chunks} chunks of {args.ctx}")
        t = time.time()
        out = our_kld(base, dirs, text=Path(args.text).read_text(encoding="utf-8"), ctx=args.ctx,
                      max_chunks=args.chunks, precision=args.precision, runtime=args.runtime, threads=args.threads)
        for s, r in out.items():
            results[s] = dict(r, base=f"{BASE} (f32 hint)", precision=args.precision, seconds=time.time() - t)


def _perplexity(d: Path, gguf: Path, kld_file: Path, args, env: dict, flags: list[str], base: bool) -> tuple[int, str]:
    cmd = [str(d / "bin/llama-perplexity"), "-m", str(gguf), "-f", args.text, "-c", str(args.ctx),
           "--chunks", str(args.chunks), "-t", str(args.threads), "--kl-divergence-base", str(kld_file)]
    if not base:
        cmd.append("--kl-divergence")
    rc, o, e = sh(cmd + flags, env=env, timeout=args.timeout)
    return rc, o + e


def _peer(kind: str, systems: list[str], ckpt: Path, work: Path, args, env: dict, results: dict,
          unavailable: dict) -> None:
    mine = [s for s in systems if system_kind(s) == kind]
    if not mine:
        return
    d, why = peers.ik_dir(args.ik_dir) if kind == "ik" else peers.llamacpp_dir(args.llamacpp_dir)
    if d is not None and not (d / "bin/llama-perplexity").exists():
        d, why = None, (f"{d} has no bin/llama-perplexity (set the peer up again: "
                        f"`mla-export bench setup-peers {'ik_llamacpp' if kind == 'ik' else 'llamacpp'}`)")
    if d is None:
        for s in mine:
            unavailable[s] = why
        return
    prefix, flags = ("ik-gguf", peers.IK_FLAGS) if kind == "ik" else ("gguf", [])
    base_gguf, why = peers.llamacpp_gguf(d, ckpt, "BF16", work, env, args.timeout, prefix=prefix)
    kld_file = work / f"{prefix}-{ckpt.name}-BF16-c{args.ctx}-n{args.chunks}.kld"
    if base_gguf is not None:
        log(f"{kind}: llama-perplexity on {base_gguf.name} (the base)")
        rc, text = _perplexity(d, base_gguf, kld_file, args, env, flags, base=True)
        if rc != 0:
            why, base_gguf = f"llama-perplexity on the BF16 base failed: {error_tail(text)}", None
    if base_gguf is None:
        for s in mine:
            unavailable[s] = why
        return
    for s in mine:
        qtype = s.split("-", 1)[1]
        gguf, why = peers.llamacpp_gguf(d, ckpt, qtype, work, env, args.timeout, prefix=prefix, keep_bf16=True)
        if gguf is None:
            unavailable[s] = why
            continue
        log(f"{kind}: llama-perplexity --kl-divergence on {gguf.name}")
        t = time.time()
        rc, text = _perplexity(d, gguf, kld_file, args, env, flags, base=False)
        (Path(args.out_dir) / f"{s}.llama-perplexity.log").write_text(text)  # the peer's own report, kept
        try:
            if rc != 0:
                raise ValueError(f"llama-perplexity failed: {error_tail(text)}")
            results[s] = dict(parse_llama_perplexity(text), base=f"{kind} BF16 GGUF", flags=" ".join(flags),
                              seconds=time.time() - t)
        except ValueError as e:
            unavailable[s] = str(e)
    kld_file.unlink(missing_ok=True)  # the base's logits: ctx x chunks x vocab floats


def markdown(results: dict, unavailable: dict, meta: dict) -> str:
    lines = [f"# KL divergence from the 16-bit base ({meta['checkpoint']}, {meta['chunks']} chunks of {meta['ctx']} "
             f"tokens, {meta['cpu']})", "",
             "| system | base | positions | mean KLD | median KLD | 99% KLD | max KLD | same top |",
             "|---|---|---|---|---|---|---|---|"]
    for s, r in results.items():
        lines.append(f"| {s} | {r['base']} | {r.get('positions', '?')} | {r['mean_kld']:.6f} ± {r['mean_kld_err']:.6f} "
                     f"| {r['median_kld']:.6f} | {r['p99_kld']:.6f} | {r['max_kld']:.6f} "
                     f"| {r['same_top_pct']:.2f} ± {r['same_top_err_pct']:.2f} % |")
    for s, why in unavailable.items():
        lines.append(f"| {s} | not available: {why} | | | | | | |")
    return "\n".join(lines) + "\n"


def run_quality(args) -> int:
    try:
        _check_args(args)
        systems = _systems(args.systems)
    except ValueError as e:
        print(f"mla-export bench quality: {e}", file=sys.stderr)
        return 2
    ckpt, work, out_dir = Path(args.checkpoint), Path(args.work_dir), Path(args.out_dir)
    work.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    results: dict = {}
    unavailable: dict = {}
    _ours(systems, ckpt, work, args, env, results, unavailable)
    _peer("llamacpp", systems, ckpt, work, args, env, results, unavailable)
    _peer("ik", systems, ckpt, work, args, env, results, unavailable)
    info = machine_info()
    meta = {"checkpoint": str(ckpt), "text": args.text, "ctx": args.ctx, "chunks": args.chunks,
            "cpu": info.get("cpu", "?"), "machine": info, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    ordered = {s: results[s] for s in systems if s in results}
    (out_dir / "quality.json").write_text(json.dumps({"meta": meta, "results": ordered, "unavailable": unavailable},
                                                     indent=1))
    md = markdown(ordered, unavailable, meta)
    (out_dir / "quality.md").write_text(md)
    print(md)
    return 0 if ordered else 1
