"""Ray Serve (`serve --replicas 2`) against one `mla-export serve` process, side by side.

    python tools/bench_ray_serve.py out/tiny [--rounds 3] [--streams 32] [--max-tokens 64]

Starts both servers (the Ray one on a local cluster), then alternates A B A B: each round runs
`--streams` concurrent streamed completions (ignore_eos, greedy) against one server and
records aggregate generated tokens/s and the CPU seconds every process of that server used
during the load (each server runs in its own session: Ray's raylet, GCS, controller and
replicas included), per generated token; then `--ttft-requests` sequential single requests for
the time to first token (the hop overhead shows there, without queueing). Medians are printed
as JSON, with the ratio of each round pair and the load average (the machine is shared: prefer
the per-round ratios). Informal: the figures depend on what else runs on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import httpx
import openai


TICK = os.sysconf("SC_CLK_TCK")


def session_cpu(sid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of every live process in session `sid`, by process
    title (Ray names its workers `ray::ServeReplica:APP:DEPLOYMENT`), pids apart."""
    out: dict[str, float] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
            rest = st[st.rfind(")") + 2:].split()
            if int(rest[3]) != sid:
                continue
            with open(f"/proc/{p}/cmdline") as f:
                cmd = f.read().replace("\0", " ").strip()
        except OSError:
            continue
        out[f"{_title(cmd)} [{p}]"] = (int(rest[11]) + int(rest[12])) / TICK
    return out


def _title(cmd: str) -> str:
    """`ray::ServeReplica:...` as Ray sets it; else the script or executable's file name."""
    words = cmd.split() or ["?"]
    if words[0].startswith("ray::"):
        return words[0]
    if "serve" in words and "mla_export.cli" in words:
        return "mla-export serve"
    script = next((w for w in words[1:] if w.endswith(".py")), words[0])
    return os.path.basename(script)


def cpu_ms_per_token(before: dict, after: dict, tokens: int) -> dict[str, float]:
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    out = {k: round(1000 * v / tokens, 4) for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v > 0}
    out["total"] = round(1000 * sum(d.values()) / tokens, 4)
    return out


def start(cmd, port):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {' '.join(cmd)}")
        time.sleep(1)
    raise SystemExit(f"server did not start: {' '.join(cmd)}")


async def one(c, prompt, max_tokens):
    t0 = time.perf_counter()
    ttft, n = None, 0
    async for chunk in await c.completions.create(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True,
                                                                           "return_token_ids": True}):
        for ch in chunk.choices:
            if ch.token_ids and ttft is None:
                ttft = time.perf_counter() - t0
            n += len(ch.token_ids)
    return ttft, n


async def load(base, streams, max_tokens):
    async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=600) as c:
        return await _load(c, streams, max_tokens)


async def _load(c, streams, max_tokens):
    prompts = [[(13 * i + 7 * k) % 250 + 3 for k in range(16 + i % 8)] for i in range(streams)]
    t0 = time.perf_counter()
    res = await asyncio.gather(*(one(c, p, max_tokens) for p in prompts))
    n = sum(n for _, n in res)
    return n / (time.perf_counter() - t0), n


async def ttfts(base, k):
    async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=600) as c:
        return [(await one(c, [5, 6, 7, 8 + i % 50, 9], 2))[0] for i in range(k)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ttft-requests", type=int, default=30)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--single-threads", type=int, default=2, help="--threads of the one-process server")
    ap.add_argument("--replica-threads", type=int, default=1, help="--threads of each Ray replica")
    ap.add_argument("--stream-interval-ms", type=float, default=0.0, help="the Ray server's (0: every step)")
    ap.add_argument("--cpu-detail", action="store_true", help="print each round's CPU ms/token per process")
    a = ap.parse_args()
    exe = [sys.executable, "-m", "mla_export.cli", "serve", a.out_dir, "--served-model-name", "m",
           "--precision", a.precision, "--log-level", "warning"]
    procs = {}
    try:
        procs["single"] = start(exe + ["--port", "18401", "--threads", str(a.single_threads)], 18401)
        procs["ray"] = start(exe + ["--port", "18402", "--replicas", str(a.replicas), "--threads",
                                    str(a.replica_threads), "--stream-interval-ms", str(a.stream_interval_ms)], 18402)
        servers = {"single": "http://127.0.0.1:18401", "ray": "http://127.0.0.1:18402"}
        tps = {k: [] for k in servers}
        cpu = {k: [] for k in servers}
        tt = {k: [] for k in servers}
        loads = []
        for name, base in servers.items():  # warm-up
            asyncio.run(load(base, 4, 4))
        for r in range(a.rounds):
            for name, base in servers.items():
                before = session_cpu(procs[name].pid)
                rate, n = asyncio.run(load(base, a.streams, a.max_tokens))
                per = cpu_ms_per_token(before, session_cpu(procs[name].pid), n)
                tps[name].append(rate)
                cpu[name].append(per)
                tt[name] += asyncio.run(ttfts(base, a.ttft_requests))
                loads.append(os.getloadavg()[0])
                if a.cpu_detail:
                    print(json.dumps({"round": r, "server": name, "tok_s": round(rate, 1), "cpu_ms_per_token": per}),
                          file=sys.stderr)
        out = {k: {"tok_s_median": round(statistics.median(tps[k]), 1), "tok_s_rounds": [round(x, 1) for x in tps[k]],
                   "cpu_ms_per_token_median": round(statistics.median(c["total"] for c in cpu[k]), 4),
                   "ttft_p50_ms": round(1000 * statistics.median(tt[k]), 2)} for k in servers}
        pair = [r / s for r, s in zip(tps["ray"], tps["single"])]
        out["ratio_tok_s_ray_over_single"] = round(out["ray"]["tok_s_median"] / out["single"]["tok_s_median"], 3)
        out["ratio_per_round"] = [round(x, 3) for x in pair]
        out["ratio_per_round_median"] = round(statistics.median(pair), 3)
        out["ttft_overhead_p50_ms"] = round(out["ray"]["ttft_p50_ms"] - out["single"]["ttft_p50_ms"], 2)
        out["load_average_1min"] = [round(min(loads), 2), round(max(loads), 2)]
        out.update(replicas=a.replicas, single_threads=a.single_threads, replica_threads=a.replica_threads,
                   stream_interval_ms=a.stream_interval_ms, streams=a.streams, max_tokens=a.max_tokens,
                   precision=a.precision, cpus=os.cpu_count())
        print(json.dumps(out, indent=1))
    finally:
        for p in procs.values():
            os.killpg(p.pid, signal.SIGINT)
        for p in procs.values():
            try:
                p.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
