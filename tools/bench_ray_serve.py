"""Ray Serve (`serve --replicas 2`) against one `mla-export serve` process, side by side.

    python tools/bench_ray_serve.py out/tiny [--rounds 3] [--streams 32] [--max-tokens 64]

Starts both servers (the Ray one on a local cluster), then alternates A B A B: each round runs
`--streams` concurrent streamed completions (ignore_eos, greedy) against one server and
records aggregate generated tokens/s, then `--ttft-requests` sequential single requests for
the time to first token (the proxy overhead shows there, without queueing). Medians are printed
as JSON. Informal: the figures depend on what else runs on the machine.
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
    return sum(n for _, n in res) / (time.perf_counter() - t0)


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
    ap.add_argument("--stream-interval-ms", type=float, default=0.0, help="the Ray server's (0: every step)")
    a = ap.parse_args()
    exe = [sys.executable, "-m", "mla_export.cli", "serve", a.out_dir, "--served-model-name", "m",
           "--precision", a.precision, "--log-level", "warning"]
    procs = []
    try:
        procs.append(start(exe + ["--port", "18401", "--threads", "2"], 18401))
        procs.append(start(exe + ["--port", "18402", "--replicas", "2", "--threads", "1",
                                  "--stream-interval-ms", str(a.stream_interval_ms)], 18402))
        servers = {"single": "http://127.0.0.1:18401", "ray2": "http://127.0.0.1:18402"}
        tps = {k: [] for k in servers}
        tt = {k: [] for k in servers}
        for name, base in servers.items():  # warm-up
            asyncio.run(load(base, 4, 4))
        for _ in range(a.rounds):
            for name, base in servers.items():
                tps[name].append(asyncio.run(load(base, a.streams, a.max_tokens)))
                tt[name] += asyncio.run(ttfts(base, a.ttft_requests))
        out = {k: {"tok_s_median": round(statistics.median(tps[k]), 1), "tok_s_rounds": [round(x, 1) for x in tps[k]],
                   "ttft_p50_ms": round(1000 * statistics.median(tt[k]), 2)} for k in servers}
        out["ratio_tok_s_ray2_over_single"] = round(out["ray2"]["tok_s_median"] / out["single"]["tok_s_median"], 3)
        out["ttft_overhead_p50_ms"] = round(out["ray2"]["ttft_p50_ms"] - out["single"]["ttft_p50_ms"], 2)
        out.update(stream_interval_ms=a.stream_interval_ms, streams=a.streams, max_tokens=a.max_tokens, precision=a.precision, cpus=os.cpu_count())
        print(json.dumps(out, indent=1))
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGINT)
        for p in procs:
            try:
                p.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
