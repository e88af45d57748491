"""`GET /metrics`: Prometheus exposition produced by `prometheus_client`, under two sets of names.

- `vllm:*` (label `model_name`): the names vLLM's own Grafana dashboards and autoscalers read
  (num_requests_running/waiting, kv_cache_usage_perc and the older gpu_cache_usage_perc,
  prompt/generation token counters, request_success_total, prefix-cache and preemption
  counters, TTFT / inter-token / end-to-end latency and per-request token-count histograms),
  so an existing vLLM dashboard works unchanged against `mla-export serve`.
- `mla_*` (label `model`): this server's own, with what vLLM has no name for (cache blocks,
  admission capacity, rejected requests, HTTP status counts).

Each `ServerMetrics` has its own registry (several apps can live in one process, as in the
tests). Histograms and counters are prometheus_client objects updated by the engine thread and
the HTTP handlers; gauges and the engine's own counters come from the stats snapshot the engine
thread takes after each step, turned into metric families by a collector at scrape time.
"""

from __future__ import annotations

import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["ServerMetrics", "CONTENT_TYPE", "parse_prometheus_text"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
RATE_WINDOW_S = 10.0
# vLLM's buckets for its request-phase histograms (queue, prefill, decode, inference, e2e) and for
# the tokens of one engine step.
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to `max_value` (max_model_len)."""
    out, mantissas, exp = [], (1, 2, 5), 0
    while True:
        for m in mantissas:
            v = m * 10 ** exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp += 1


class ServerMetrics:
    def __init__(self, model_name: str = "model", max_model_len: int | None = None):
        """`max_model_len` bounds the token-count buckets of the request-parameter histograms (as
        vLLM's); without it they reach 100000."""
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        r, mn = self.registry, ["model_name"]
        self._lock = threading.Lock()
        self._stats: dict = {}
        self._replicas: dict[str, dict] = {}
        self._model = model_name
        self._healthy = False
        # Our own names (no model label on the histograms, as before).
        self.ttft = Histogram("mla_time_to_first_token_seconds",
                              "Time from arrival in the engine to the first generated token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram("mla_e2e_request_latency_seconds", "Time from arrival in the engine to the last token.",
                             buckets=E2E_BUCKETS, registry=r)
        # The `mla_*` counters carry the served name given at scrape time: kept here, emitted by
        # the snapshot collector.
        self.finished = collections.Counter()  # finish_reason -> sequences
        self.rejected = collections.Counter()  # reason -> HTTP requests
        self.http_requests = collections.Counter()  # (endpoint, status) -> count
        # vLLM's names.
        self.v_ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                mn, buckets=TTFT_BUCKETS, registry=r)
        self.v_itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                               mn, buckets=ITL_BUCKETS, registry=r)
        self.v_tpot = Histogram("vllm:time_per_output_token_seconds",
                                "Histogram of time per output token in seconds (the older name of the inter-token "
                                "latency, which older dashboards read).", mn, buckets=ITL_BUCKETS, registry=r)
        self.v_e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                               mn, buckets=E2E_BUCKETS, registry=r)
        self.v_req_prompt = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", mn,
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.v_req_gen = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", mn,
                                   buckets=TOKEN_BUCKETS, registry=r)
        self.v_prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", mn, registry=r)
        self.v_gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", mn, registry=r)
        self.v_success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                 mn + ["finished_reason"], registry=r)
        for reason in ("stop", "length", "abort"):  # present from the start, as vLLM's are
            self.v_success.labels(model_name, reason)
        self.v_prompt.labels(model_name)
        self.v_gen.labels(model_name)
        # vLLM's request phases, from the engine's timestamps of each finished sequence.
        phase = lambda name, doc: Histogram(name, doc, mn, buckets=REQUEST_LATENCY_BUCKETS, registry=r)  # noqa: E731
        self.v_queue = phase("vllm:request_queue_time_seconds",
                             "Histogram of time spent in WAITING phase for request (arrival to first scheduled).")
        self.v_prefill = phase("vllm:request_prefill_time_seconds",
                               "Histogram of time spent in PREFILL phase for request (first scheduled to first token).")
        self.v_decode = phase("vllm:request_decode_time_seconds",
                              "Histogram of time spent in DECODE phase for request (first token to last token).")
        self.v_inference = phase("vllm:request_inference_time_seconds",
                                 "Histogram of time spent in RUNNING phase for request (first scheduled to last token).")
        self.v_iter_tokens = Histogram("vllm:iteration_tokens_total",
                                       "Histogram of number of tokens per engine_step (generated tokens plus the "
                                       "prompts whose first token the step produced).",
                                       mn, buckets=ITERATION_TOKEN_BUCKETS, registry=r)
        count_buckets = buckets_1_2_5(max_model_len or 100000)
        self.v_max_gen = Histogram("vllm:request_max_num_generation_tokens",
                                   "Histogram of maximum number of requested generation tokens (the longest of a "
                                   "prompt's n choices).", mn, buckets=count_buckets, registry=r)
        self.v_params_n = Histogram("vllm:request_params_n", "Histogram of the n request parameter.", mn,
                                    buckets=N_BUCKETS, registry=r)
        self.v_params_max_tokens = Histogram("vllm:request_params_max_tokens",
                                             "Histogram of the max_tokens request parameter.", mn,
                                             buckets=count_buckets, registry=r)
        for h in (self.v_ttft, self.v_itl, self.v_tpot, self.v_e2e, self.v_req_prompt, self.v_req_gen, self.v_queue,
                  self.v_prefill, self.v_decode, self.v_inference, self.v_iter_tokens, self.v_max_gen,
                  self.v_params_n, self.v_params_max_tokens):
            h.labels(model_name)  # present (empty) from the start, as vLLM's
        self.cache_config: dict[str, str] | None = None  # vllm:cache_config_info's labels (set_cache_config)
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.prompt_tokens_processed = 0  # prompts whose first token is out (the stats line's prompt throughput)
        self._window: collections.deque = collections.deque()  # (monotonic time, tokens) per step
        self.started = time.time()
        r.register(_SnapshotCollector(self))

    # ---- updates (any thread) ---------------------------------------------------------------
    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.v_ttft.labels(self.model_name).observe(seconds)

    def observe_token_gap(self, seconds: float) -> None:
        """The time between two tokens of one request (one per decoded token)."""
        self.v_itl.labels(self.model_name).observe(seconds)
        self.v_tpot.labels(self.model_name).observe(seconds)

    def observe_end(self, reason: str, e2e_seconds: float | None, num_generated: int, num_prompt: int = 0) -> None:
        """A sequence ended; `e2e_seconds` is None for one the server aborted."""
        self.v_success.labels(self.model_name, reason).inc()
        with self._lock:
            self.finished[reason] += 1
            self.prompt_tokens += num_prompt
        self.v_prompt.labels(self.model_name).inc(num_prompt)
        if e2e_seconds is not None:
            self.e2e.observe(e2e_seconds)
            self.v_e2e.labels(self.model_name).observe(e2e_seconds)
            self.v_req_prompt.labels(self.model_name).observe(num_prompt)
            self.v_req_gen.labels(self.model_name).observe(num_generated)

    def observe_phases(self, queue: float | None, prefill: float | None, decode: float | None,
                       inference: float | None) -> None:
        """A finished sequence's phases (vLLM's): each None when the engine did not reach it."""
        for hist, v in ((self.v_queue, queue), (self.v_prefill, prefill), (self.v_decode, decode),
                        (self.v_inference, inference)):
            if v is not None:
                hist.labels(self.model_name).observe(max(0.0, v))

    def observe_params(self, max_tokens: int | None) -> None:
        """A finished sequence's max_tokens (vLLM observes it per finished request)."""
        if max_tokens:
            self.v_params_max_tokens.labels(self.model_name).observe(max_tokens)

    def observe_parent(self, n: int, max_generated: int) -> None:
        """A prompt's n choices all ended: n and the most tokens one of them generated."""
        self.v_params_n.labels(self.model_name).observe(n)
        self.v_max_gen.labels(self.model_name).observe(max_generated)

    def observe_iteration(self, tokens: int) -> None:
        """One engine step's tokens (vLLM's iteration_tokens_total)."""
        self.v_iter_tokens.labels(self.model_name).observe(tokens)

    def set_cache_config(self, info: dict) -> None:
        """vllm:cache_config_info's labels (values as strings, as vLLM's)."""
        self.cache_config = {str(k): str(v) for k, v in info.items()}

    def counters(self) -> dict:
        """Cumulative token counts (the periodic stats line takes their differences)."""
        with self._lock:
            return {"prompt_tokens": self.prompt_tokens_processed, "generation_tokens": self.generated_tokens}

    def observe_step(self, now: float, new_tokens: int, prompt_tokens: int = 0) -> None:
        """Tokens generated by one step (or one batch of outputs), and `prompt_tokens`: the
        prompts whose first token arrived in it."""
        with self._lock:
            self.prompt_tokens_processed += prompt_tokens
            self.generated_tokens += new_tokens
            if new_tokens:
                self._window.append((now, new_tokens))
            self._trim(now)
        if new_tokens:
            self.v_gen.labels(self.model_name).inc(new_tokens)

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
    def render(self, stats: dict, *, model: str, healthy: bool, replicas: dict[str, dict] | None = None) -> str:
        """The exposition text, with `stats` (the engine's snapshot) as the gauges' values and,
        when the engine runs as several replicas, `replicas` (replica id -> its stats) as the
        `mla_replica_*` families."""
        with self._lock:
            self._stats, self._healthy, self._model = dict(stats), healthy, model
            self._replicas = {k: dict(v) for k, v in (replicas or {}).items()}
        return generate_latest(self.registry).decode("utf-8")


class _SnapshotCollector:
    """Gauges and engine counters from the latest engine stats snapshot, read at scrape time."""

    def __init__(self, metrics: ServerMetrics):
        self.m = metrics

    def describe(self):
        return []  # nothing to check at registration: the families depend on the snapshot

    def collect(self):
        m = self.m
        with m._lock:
            stats, healthy, model, replicas = dict(m._stats), m._healthy, m._model, dict(m._replicas)
            gen, prompt = m.generated_tokens, m.prompt_tokens
            finished, rejected, http = dict(m.finished), dict(m.rejected), dict(m.http_requests)
        g = lambda key: stats.get(key, 0) or 0  # noqa: E731
        total, used = g("kv_blocks_total"), g("kv_blocks_used")
        usage = used / total if total else 0.0
        q, h = g("prefix_cache_queries"), g("prefix_cache_hits")
        tps = m.tokens_per_second()

        def gauge(name, doc, value, labels=("model",), values=None):
            fam = GaugeMetricFamily(name, doc, labels=list(labels))
            fam.add_metric(list(values or [model]), value)
            return fam

        def counter(name, doc, value, labels=("model",), values=None):
            fam = CounterMetricFamily(name, doc, labels=list(labels))
            fam.add_metric(list(values or [model]), value)
            return fam

        yield gauge("mla_up", "1 when the engine thread is alive and healthy.", 1 if healthy else 0)
        yield gauge("mla_num_requests_running", "Sequences being scheduled by the engine.", g("num_running"))
        yield gauge("mla_num_requests_waiting", "Sequences waiting for the engine (not yet scheduled or preempted).",
                    g("num_waiting"))
        yield gauge("mla_server_requests_in_flight", "Sequences admitted by the server and not yet ended.",
                    g("server_in_flight"))
        yield gauge("mla_server_request_capacity", "max_num_seqs + max_queue: more sequences are refused with 429.",
                    g("server_capacity"))
        yield gauge("mla_kv_blocks_total", "KV cache blocks in the pool.", total)
        yield gauge("mla_kv_blocks_used", "KV cache blocks referenced by requests.", used)
        yield gauge("mla_kv_blocks_free", "KV cache blocks not referenced by any request (prefix-cached ones included).",
                    g("kv_blocks_free"))
        yield gauge("mla_kv_cache_usage_ratio", "kv_blocks_used / kv_blocks_total.", usage)
        yield counter("mla_prefix_cache_queries", "Prefix-cache lookups (in the engine's unit, see its stats).", q)
        yield counter("mla_prefix_cache_hits", "Prefix-cache hits (same unit as the queries).", h)
        yield gauge("mla_prefix_cache_hit_rate", "prefix_cache_hits_total / prefix_cache_queries_total since start.",
                    h / q if q else 0.0)
        yield gauge("mla_generation_tokens_per_second",
                    f"Tokens generated per second over the last {RATE_WINDOW_S:g} s.", tps)
        yield counter("mla_generation_tokens", "Tokens generated.", gen)
        yield counter("mla_prompt_tokens", "Prompt tokens of finished sequences.", prompt)
        fam = CounterMetricFamily("mla_request_finished", "Sequences ended, by finish reason (abort: cancelled).",
                                  labels=["model", "finish_reason"])
        for reason, n in sorted(finished.items()) or [("stop", 0)]:
            fam.add_metric([model, reason], n)
        yield fam
        fam = CounterMetricFamily("mla_request_rejected", "HTTP requests refused before reaching the engine, by reason.",
                                  labels=["model", "reason"])
        for reason, n in sorted(rejected.items()) or [("queue_full", 0)]:
            fam.add_metric([model, reason], n)
        yield fam
        fam = CounterMetricFamily("mla_http_requests", "HTTP requests answered, by endpoint and status.",
                                  labels=["endpoint", "status"])
        for (endpoint, status), n in sorted(http.items()):
            fam.add_metric([endpoint, str(status)], n)
        yield fam
        yield from _replica_families(replicas)
        mn, name = ("model_name",), [m.model_name]
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    g("num_running"), mn, name)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    g("num_waiting"), mn, name)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage, mn, name)
        yield gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (the older name dashboards read; CPU cache here). "
                    "1 means 100 percent usage.", usage, mn, name)
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries (in the engine's unit).", q, mn, name)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits (in the engine's unit).", h, mn, name)
        yield counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.",
                      g("num_preemptions"), mn, name)
        if "spec_decode_num_drafts" in stats:  # the engine speculates (vLLM's names and meanings)
            yield counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts (verify steps with drafts).",
                          g("spec_decode_num_drafts"), mn, name)
            yield counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
                          g("spec_decode_num_draft_tokens"), mn, name)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                          g("spec_decode_num_accepted_tokens"), mn, name)
            fam = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted tokens per draft position.", labels=["model_name", "position"])
            for pos, n in enumerate(stats.get("spec_decode_num_accepted_tokens_per_pos") or ()):
                fam.add_metric([m.model_name, str(pos)], n)
            yield fam
        if m.cache_config is not None:
            info = dict(m.cache_config)
            fam = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                    labels=list(info))
            fam.add_metric(list(info.values()), 1.0)
            yield fam


# (family, help, stats key, counter?) per replica, labelled by replica id: which replica holds
# which prefixes shows in its hit counts.
_REPLICA_FAMILIES = (
    ("mla_replica_up", "1 while the replica is alive (0: it died; Ray Serve replaces it under a new id).", "up", False),
    ("mla_replica_requests", "Submissions (HTTP generation requests) this replica accepted.", "requests", True),
    ("mla_replica_prefix_cache_queries", "Prefix-cache lookups on this replica (engine's unit).",
     "prefix_cache_queries", True),
    ("mla_replica_prefix_cache_hits", "Prefix-cache hits on this replica (same unit as the queries).",
     "prefix_cache_hits", True),
    ("mla_replica_kv_blocks_used", "KV cache blocks referenced by requests on this replica.", "kv_blocks_used", False),
    ("mla_replica_kv_blocks_total", "KV cache blocks in this replica's pool.", "kv_blocks_total", False),
    ("mla_replica_num_requests_running", "Sequences being scheduled by this replica's engine.", "num_running", False),
    ("mla_replica_pid", "The replica's process id (for operators and the fault tests).", "pid", False),
)


def _replica_families(replicas: dict[str, dict]):
    if not replicas:
        return
    for name, doc, key, is_counter in _REPLICA_FAMILIES:
        fam = (CounterMetricFamily if is_counter else GaugeMetricFamily)(name, doc, labels=["replica"])
        for rid, s in sorted(replicas.items()):
            fam.add_metric([rid], float(s.get(key, 0) or 0))
        yield fam
    fam = GaugeMetricFamily("mla_replica_prefix_cache_hit_rate", "prefix_cache_hits / prefix_cache_queries per replica.",
                            labels=["replica"])
    for rid, s in sorted(replicas.items()):
        q = s.get("prefix_cache_queries", 0) or 0
        fam.add_metric([rid], (s.get("prefix_cache_hits", 0) or 0) / q if q else 0.0)
    yield fam


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
