"""vLLM's serving metrics (vllm/benchmarks/serve.py calculate_metrics) from timed requests, under
vLLM's result field names:

- request_throughput = completed / duration; output_throughput = output tokens / duration;
  total_token_throughput = (input + output tokens) / duration (successful requests only).
- TTFT per request; TPOT = (E2EL - TTFT) / (output tokens - 1) for requests with more than one
  output token; ITL = every gap between consecutive token chunks of every request (pooled);
  E2EL = send to last token chunk.
- for each metric in `percentile_metrics`: mean_/median_/std_{m}_ms and p{P}_{m}_ms for each P
  (numpy's linear percentile; an empty list counts as 0, as vLLM does).
- max_output_tokens_per_s: the most token chunks landing in one 1-second bucket from the first
  request's start; max_concurrent_requests: the most requests in flight at once."""

from __future__ import annotations

import math

import numpy as np

from mla_export.bench.serving.client import RequestOutput

METRICS = ("ttft", "tpot", "itl", "e2el")


def percentile_key(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _stats(name: str, values: list[float], percentiles: list[float]) -> dict:
    v = values or [0.0]
    out = {f"mean_{name}_ms": float(np.mean(v)) * 1000, f"median_{name}_ms": float(np.median(v)) * 1000,
           f"std_{name}_ms": float(np.std(v)) * 1000}
    for p in percentiles:
        out[f"p{percentile_key(p)}_{name}_ms"] = float(np.percentile(v, p)) * 1000
    return out


def peak_figures(ok: list[RequestOutput]) -> tuple[float, int]:
    """(max token chunks in a 1-second bucket, max requests in flight), as vLLM counts them."""
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    t1 = max(o.start_time + o.latency for o in ok)
    buckets = np.zeros(int(math.ceil(t1 - t0)) + 1)
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for tt in times:
            b = int(tt - t0)
            if 0 <= b < buckets.size:
                buckets[b] += 1
    # half-open [start, end): an end at the same instant as a start comes first
    events = sorted([(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1) for o in ok])
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return float(buckets.max()), peak


def calculate_metrics(outputs: list[RequestOutput], duration_s: float, percentiles: list[float],
                      percentile_metrics: tuple[str, ...] = METRICS) -> dict:
    if duration_s <= 0:
        raise ValueError(f"benchmark duration must be > 0 s, got {duration_s}")
    unknown = set(percentile_metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"--percentile-metrics: unknown {sorted(unknown)} (allowed: {', '.join(METRICS)})")
    ok = [o for o in outputs if o.success]
    ttfts = [o.ttft for o in ok]
    e2els = [o.latency for o in ok]
    itls = [g for o in ok for g in o.itl]
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    peak_tps, peak_conc = peak_figures(ok)
    res = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
        "max_output_tokens_per_s": peak_tps,
        "max_concurrent_requests": peak_conc,
    }
    series = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for m in METRICS:
        if m in percentile_metrics:
            res.update(_stats(m, series[m], percentiles))
    return res


def detailed_fields(outputs: list[RequestOutput]) -> dict:
    """vLLM's per-request arrays (--save-detailed): lengths, times in seconds, texts, errors."""
    return {"input_lens": [o.prompt_len for o in outputs],
            "output_lens": [o.output_tokens if o.success else 0 for o in outputs],
            "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
            "latencies": [o.latency for o in outputs], "start_times": [o.start_time for o in outputs],
            "queue_times": [o.client_queue_time for o in outputs],
            "generated_texts": [o.generated_text for o in outputs], "errors": [o.error for o in outputs]}
