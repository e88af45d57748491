"""Helpers shared by the benchmark's orchestrator, workers and peers: logging, memory figures,
subprocess runs with their own peak RSS, the decode-step statistics every system reports."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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


def _meminfo_gb(key: str, missing: float) -> float:
    """A /proc/meminfo figure in GiB (`missing` where it cannot be read)."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return missing


def mem_available_gb() -> float:
    return _meminfo_gb("MemAvailable", float("inf"))


def wait_for_memory(need_gb: float, max_wait_s: float) -> tuple[bool, float]:
    """Wait until MemAvailable >= need_gb (the machine is shared); (ok, available GB)."""
    t0 = time.time()
    while True:
        avail = mem_available_gb()
        if avail >= need_gb or time.time() - t0 >= max_wait_s:
            return avail >= need_gb, avail
        time.sleep(10)


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


def sh(cmd: list[str], timeout: float | None = None, env: dict | None = None) -> tuple[int, str, str]:
    try:
        # errors="replace": a peer's log may print token text cut inside a UTF-8 character
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -9, out, f"timeout after {timeout} s"
    except OSError as e:
        return -1, "", f"{cmd[0]}: {e}"


def sh_rss(cmd: list[str], timeout: float | None = None, env: dict | None = None) -> tuple[int, str, str, float]:
    """Run `cmd` and return (rc, stdout, stderr, its peak RSS in MB) from wait4's rusage."""
    try:
        # errors="replace": ik_llama.cpp's log prints random checkpoints' token text cut inside a
        # UTF-8 character (a strict decode killed the reader thread and lost the whole output)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env)
    except OSError as e:
        return -1, "", f"{cmd[0]}: {e}", float("nan")
    import threading

    chunks = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda s=s, k=k: chunks[k].append(s.read()), daemon=True)
               for s, k in ((p.stdout, "out"), (p.stderr, "err"))]
    for r in readers:
        r.start()
    t0, rusage, rc = time.time(), None, None
    while rc is None:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            rc, rusage = os.waitstatus_to_exitcode(status), ru
            p.returncode = rc
            break
        if timeout is not None and time.time() - t0 > timeout:
            p.kill()
            _, status, rusage = os.wait4(p.pid, 0)
            p.returncode = rc = -9
            chunks["err"].append(f"\ntimeout after {timeout} s")
            break
        time.sleep(0.2)
    for r in readers:
        r.join(timeout=10)
    return rc, "".join(chunks["out"]), "".join(chunks["err"]), rusage.ru_maxrss / 1024.0


def parse_result(rc: int, out: str, err: str) -> dict:
    """The `RESULT {json}` line a worker prints last, or a failure with the stderr tail."""
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"ok": False, "error": f"exit {rc}: {error_tail(err, limit=600)}"}


def error_tail(text: str, lines: int = 3, limit: int = 400) -> str:
    """The last `lines` non-empty lines of a failed command's output joined with ' | ', whole:
    lines are dropped from the front to fit `limit` characters, and a single line longer than
    that keeps its end from a word boundary after an ellipsis (never a word cut in two)."""
    kept = [x.strip() for x in text.strip().splitlines() if x.strip()][-lines:]
    while len(kept) > 1 and len(" | ".join(kept)) > limit:
        kept.pop(0)
    tail = " | ".join(kept)
    if len(tail) > limit:
        cut = tail[-limit:]
        space = cut.find(" ")
        tail = "... " + (cut[space + 1:] if 0 <= space < len(cut) - 1 else cut)
    return tail


def type_bytes(name: str | None) -> int | None:
    if not name:
        return None
    n = name.lower()
    for k, b in (("f32", 4), ("float32", 4), ("bf16", 2), ("bfloat16", 2), ("f16", 2), ("float16", 2), ("u8", 1),
                 ("i8", 1)):
        if k in n:
            return b
    return None


def machine_info() -> dict:
    flags = model = family = number = ""
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
        flags = next(line for line in lines if line.startswith("flags"))
        field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines[:30])}
        model, family, number = field.get("model name", ""), field.get("cpu family", ""), field.get("model", "")
    except (OSError, StopIteration):
        pass
    return {"cpu": f"{model} (family {family} model {number})" if family else model, "cores": os.cpu_count(), "avx2": " avx2" in flags, "avx512f": " avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
            "python": platform.python_version(), "mem_total_gb": round(_meminfo_gb("MemTotal", float("nan")), 1),
            "note": "shared machine: other jobs may run; compare the ratios within one run (alternated runs, medians)"}



def timed_generate(model, generation_config, ids: list[list[int]], new_tokens: int, **generate_kwargs):
    """transformers' greedy `generate` on a batch of equal-length prompts, with a logits
    processor that stamps each step: (start time, step stamps, generate's output). The
    transformers and optimum-intel peers time decoding this one way. Imports torch and
    transformers only when called (this module itself needs the standard library only)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class Stamp(LogitsProcessor):
        def __init__(self):
            self.t = []

        def __call__(self, input_ids, scores):
            self.t.append(time.perf_counter())
            return scores

    stamp = Stamp()
    x = torch.tensor(ids, dtype=torch.long)
    t_start = time.perf_counter()
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                         num_beams=1, generation_config=generation_config,
                         logits_processor=LogitsProcessorList([stamp]), **generate_kwargs)
    return t_start, stamp.t, out
