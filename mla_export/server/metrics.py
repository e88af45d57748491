"""Prometheus text exposition (format 0.0.4) for `GET /metrics`, without a client library.

Gauges come from the engine's stats snapshot (taken by the engine thread after each step);
counters and histograms are kept here, updated by the engine thread and the HTTP handlers.
"""

from __future__ import annotations

import collections
import math
import threading
import time

__all__ = ["ServerMetrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "mla"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RATE_WINDOW_S = 10.0


class _Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{_fmt(b)}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {_fmt(self.sum)}")
        out.append(f"{name}_count {self.count}")
        return out


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class ServerMetrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.e2e = _Histogram(E2E_BUCKETS)
        self.finished = collections.Counter()  # finish_reason -> sequences
        self.rejected = collections.Counter()  # reason -> HTTP requests
        self.http_requests = collections.Counter()  # (endpoint, status) -> count
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self._window: collections.deque = collections.deque()  # (monotonic time, tokens) per step
        self.started = time.time()

    # ---- updates (any thread) ---------------------------------------------------------------
    def observe_ttft(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def observe_end(self, reason: str, e2e_seconds: float | None, num_generated: int, num_prompt: int = 0) -> None:
        with self._lock:
            self.finished[reason] += 1
            self.prompt_tokens += num_prompt
            if e2e_seconds is not None:
                self.e2e.observe(e2e_seconds)

    def observe_step(self, now: float, new_tokens: int) -> None:
        with self._lock:
            self.generated_tokens += new_tokens
            if new_tokens:
                self._window.append((now, new_tokens))
            self._trim(now)

    def observe_rejected(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    def observe_http(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.http_requests[(endpoint, status)] += 1

    def _trim(self, now: float) -> None:
        while self._window and self._window[0][0] < now - RATE_WINDOW_S:
            self._window.popleft()

    def tokens_per_second(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._trim(now)
            total = sum(n for _, n in self._window)
        return total / RATE_WINDOW_S

    # ---- exposition -------------------------------------------------------------------------
    def render(self, stats: dict, *, model: str, healthy: bool) -> str:
        tps = self.tokens_per_second()
        lines: list[str] = []

        def metric(name, kind, help_text, samples):
            full = f"{PREFIX}_{name}"
            lines.append(f"# HELP {full} {help_text}")
            lines.append(f"# TYPE {full} {kind}")
            for labels, value in samples:
                lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
                lines.append(f"{full}{{{lab}}} {_fmt(value)}" if lab else f"{full} {_fmt(value)}")

        g = lambda key, default=0: stats.get(key, default)  # noqa: E731
        m = {"model": model}
        metric("up", "gauge", "1 when the engine thread is alive and healthy.", [(m, 1 if healthy else 0)])
        metric("num_requests_running", "gauge", "Sequences being scheduled by the engine.", [(m, g("num_running"))])
        metric("num_requests_waiting", "gauge", "Sequences waiting for the engine (not yet scheduled or preempted).",
               [(m, g("num_waiting"))])
        metric("server_requests_in_flight", "gauge", "Sequences admitted by the server and not yet ended.",
               [(m, g("server_in_flight"))])
        metric("server_request_capacity", "gauge", "max_num_seqs + max_queue: more sequences are refused with 429.",
               [(m, g("server_capacity"))])
        total = g("kv_blocks_total")
        used = g("kv_blocks_used")
        metric("kv_blocks_total", "gauge", "KV cache blocks in the pool.", [(m, total)])
        metric("kv_blocks_used", "gauge", "KV cache blocks referenced by requests.", [(m, used)])
        metric("kv_blocks_free", "gauge", "KV cache blocks not referenced by any request (prefix-cached ones included).",
               [(m, g("kv_blocks_free"))])
        metric("kv_cache_usage_ratio", "gauge", "kv_blocks_used / kv_blocks_total.", [(m, used / total if total else 0.0)])
        q = g("prefix_cache_queries")
        h = g("prefix_cache_hits")
        metric("prefix_cache_queries_total", "counter", "Prefix-cache lookups (in the engine's unit, see its stats).", [(m, q)])
        metric("prefix_cache_hits_total", "counter", "Prefix-cache hits (same unit as the queries).", [(m, h)])
        metric("prefix_cache_hit_rate", "gauge", "prefix_cache_hits_total / prefix_cache_queries_total since start.",
               [(m, h / q if q else 0.0)])
        with self._lock:
            gen = self.generated_tokens
            prompt = self.prompt_tokens
            finished = dict(self.finished)
            rejected = dict(self.rejected)
            http = dict(self.http_requests)
            ttft_lines = self.ttft.lines(f"{PREFIX}_time_to_first_token_seconds")
            e2e_lines = self.e2e.lines(f"{PREFIX}_e2e_request_latency_seconds")
        metric("generation_tokens_total", "counter", "Tokens generated.", [(m, gen)])
        metric("prompt_tokens_total", "counter", "Prompt tokens of finished sequences.", [(m, prompt)])
        metric("generation_tokens_per_second", "gauge",
               f"Tokens generated per second over the last {RATE_WINDOW_S:g} s.", [(m, tps)])
        metric("request_finished_total", "counter", "Sequences ended, by finish reason (abort: cancelled).",
               [({**m, "finish_reason": r}, c) for r, c in sorted(finished.items())] or [({**m, "finish_reason": "stop"}, 0)])
        metric("request_rejected_total", "counter", "HTTP requests refused before reaching the engine, by reason.",
               [({**m, "reason": r}, c) for r, c in sorted(rejected.items())] or [({**m, "reason": "queue_full"}, 0)])
        metric("http_requests_total", "counter", "HTTP requests answered, by endpoint and status.",
               [({"endpoint": e, "status": str(s)}, c) for (e, s), c in sorted(http.items())])
        lines.append(f"# HELP {PREFIX}_time_to_first_token_seconds Time from arrival in the engine to the first generated token.")
        lines.append(f"# TYPE {PREFIX}_time_to_first_token_seconds histogram")
        lines.extend(ttft_lines)
        lines.append(f"# HELP {PREFIX}_e2e_request_latency_seconds Time from arrival in the engine to the last token.")
        lines.append(f"# TYPE {PREFIX}_e2e_request_latency_seconds histogram")
        lines.extend(e2e_lines)
        return "\n".join(lines) + "\n"


def parse_prometheus_text(text: str) -> dict[str, float]:
    """A minimal parser of the exposition format (sample name with labels -> value), for tests
    and tools: `{'mla_kv_blocks_used{model="x"}': 0.0, ...}`."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out
