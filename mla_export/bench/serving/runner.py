"""One benchmark run as `vllm bench serve` runs it, and the sweep of runs over concurrencies,
rounds and two targets.

A run: all prompts are released on an arrival schedule (--request-rate inf: all at t=0; else a
Poisson process, or gamma intervals with --burstiness != 1, rescaled so that the last arrival
is at num_prompts / rate, as vLLM does), an asyncio semaphore keeps at most --max-concurrency in
flight, and the duration runs from the first release to the last response. Warm-up requests go
first, outside the timing, on prompts of their own (vLLM repeats the first measured prompt,
which would put it in a prefix cache before it is measured).

The sweep: for each round, for each concurrency, target A then target B (A B A B), each run on
fresh prompts drawn for that (round, concurrency) and shared by A and B: the two servers see the
same text, and no run re-sends a prompt an earlier run left in a server's prefix cache."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime

import httpx
import numpy as np

from mla_export.bench.serving.client import RequestOutput, completion_payload, stream_completion
from mla_export.bench.serving.dataset import SampleRequest, random_requests
from mla_export.bench.serving.metrics import calculate_metrics, detailed_fields

ENDPOINT = "/v1/completions"
REQUEST_TIMEOUT_S = 6 * 3600  # vLLM's client timeout; a stuck request still ends the run
WARMUP_SEED_OFFSET = 1_000_003  # warm-up prompts: a seed no measured run uses


@dataclass
class Target:
    label: str
    base_url: str
    model: str | None = None  # None: the first id of the server's /v1/models


@dataclass
class RunConfig:
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float = 0.0
    request_rate: float = float("inf")
    burstiness: float = 1.0
    max_concurrency: int | None = None
    num_warmups: int = 0
    ignore_eos: bool = True
    seed: int = 0
    percentiles: list[float] = field(default_factory=lambda: [99.0])
    percentile_metrics: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
    extra_body: dict | None = None
    save_detailed: bool = False
    prompt_format: str = "text"  # "text" | "token-ids"


def arrival_times(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> list[float]:
    """Release time of each request, seconds from the start."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"--request-rate and --burstiness must be > 0, got {rate} and {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    t = np.cumsum(gaps)
    return (t * ((n / rate) / t[-1])).tolist()  # vLLM: the last arrival lands at n / rate


def _headers() -> dict:
    key = os.environ.get("OPENAI_API_KEY")  # as vLLM's client: a key for servers started with one
    return {"Authorization": f"Bearer {key}"} if key else {}


async def resolve_model(client: httpx.AsyncClient, target: Target) -> str:
    if target.model:
        return target.model
    url = f"{target.base_url}/v1/models"
    try:
        r = await client.get(url, headers=_headers())
    except httpx.HTTPError as e:
        raise RuntimeError(f"{target.label}: cannot reach {url} ({type(e).__name__}: {e}); is the server up?") from e
    if r.status_code != 200:
        raise RuntimeError(f"{target.label}: GET {url} answered HTTP {r.status_code}: {r.text[:300]}")
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise RuntimeError(f"{target.label}: {url} lists no model ({r.text[:300]})") from e


def _client(max_concurrency: int | None) -> httpx.AsyncClient:
    # no pool cap without --max-concurrency: the pool must not become a hidden concurrency limit
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    return httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0), limits=limits, trust_env=False)


async def _run_requests(client, url: str, model: str, samples: list[SampleRequest], cfg: RunConfig, tokenizer,
                        arrivals: list[float]) -> tuple[list[RequestOutput], float]:
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else contextlib.nullcontext()
    headers = _headers()

    async def one(s: SampleRequest, released: float) -> RequestOutput:
        async with sem:
            o = await stream_completion(client, url, completion_payload(model, s.payload_prompt(cfg.prompt_format),
                                                                        s.expected_output_len, cfg.ignore_eos,
                                                                        cfg.extra_body),
                                        s.payload_len(cfg.prompt_format), tokenizer, headers)
        o.client_queue_time = o.start_time - released
        return o

    start = time.perf_counter()
    tasks = []
    for s, at in zip(samples, arrivals):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(s, time.perf_counter())))
    outputs = await asyncio.gather(*tasks)
    return outputs, time.perf_counter() - start


async def run_once(target: Target, samples: list[SampleRequest], warmups: list[SampleRequest], cfg: RunConfig,
                   tokenizer) -> dict:
    """One `vllm bench serve` run against one target: its result JSON (vLLM's field names)."""
    async with _client(cfg.max_concurrency) as client:
        model = await resolve_model(client, target)
        url = f"{target.base_url}{ENDPOINT}"
        if warmups:
            wout, _ = await _run_requests(client, url, model, warmups, cfg, tokenizer, [0.0] * len(warmups))
            bad = [o.error for o in wout if not o.success]
            if bad:
                raise RuntimeError(f"{target.label}: warm-up request failed: {bad[0]}")
        load_before = os.getloadavg()[0]
        arrivals = arrival_times(len(samples), cfg.request_rate, cfg.burstiness, np.random.default_rng(cfg.seed))
        outputs, duration = await _run_requests(client, url, model, samples, cfg, tokenizer, arrivals)
        load_after = os.getloadavg()[0]
    res = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai", "endpoint_type": "openai",
           "label": target.label, "base_url": target.base_url, "model_id": model, "num_prompts": len(samples),
           "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
           "burstiness": cfg.burstiness, "max_concurrency": cfg.max_concurrency,
           "random_input_len": cfg.input_len, "random_output_len": cfg.output_len, "num_warmups": len(warmups),
           "prompt_format": cfg.prompt_format}
    res.update(calculate_metrics(outputs, duration, cfg.percentiles, cfg.percentile_metrics))
    ok = [o for o in outputs if o.success]
    res["output_tokens_from"] = {src: sum(o.output_tokens_from == src for o in ok) for src in ("usage", "tokenizer")}
    res["errors_sample"] = [o.error for o in outputs if not o.success][:5]
    res["load_avg_1m_before"], res["load_avg_1m_after"] = load_before, load_after
    if cfg.save_detailed:
        res.update(detailed_fields(outputs))
    return res


def draw_prompts(tokenizer, cfg: RunConfig, seed: int, n: int | None = None) -> list[SampleRequest]:
    samples, mismatch = random_requests(tokenizer, n or cfg.num_prompts, cfg.input_len, cfg.output_len,
                                        cfg.range_ratio, seed)
    if mismatch:
        print(f"  note: prompts re-encode to {abs(mismatch)} {'more' if mismatch > 0 else 'fewer'} tokens in all "
              "than drawn (vLLM's random dataset has the same slack); the real lengths are reported")
    return samples


def sweep(targets: list[Target], cfg: RunConfig, concurrencies: list[int | None], rounds: int, tokenizer,
          on_result=None) -> list[dict]:
    """Every run of the sweep, in the order run; each result also names its round and target."""
    runs = []
    for r in range(rounds):
        for ci, conc in enumerate(concurrencies):
            seed = cfg.seed + 7919 * r + 104729 * ci  # one fresh prompt set per (round, concurrency)
            run_cfg = RunConfig(**{**cfg.__dict__, "max_concurrency": conc, "seed": seed})
            samples = draw_prompts(tokenizer, run_cfg, seed)
            warm = draw_prompts(tokenizer, run_cfg, seed + WARMUP_SEED_OFFSET, cfg.num_warmups) if cfg.num_warmups else []
            for t in targets:
                res = asyncio.run(run_once(t, samples, warm, run_cfg, tokenizer))
                res["round"], res["seed"] = r, seed
                runs.append(res)
                if on_result:
                    on_result(res)
    return runs
