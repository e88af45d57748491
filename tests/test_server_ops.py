"""Operating the server as vLLM users expect: the periodic stats line (computed from known
counts), request and access logs (never the prompt), the port checked before the model loads,
the start-up memory line, and vLLM's request-phase / parameter / cache-config metrics on a live
server (values consistent with each other and with the requests sent; no timing thresholds).

Precision: f32 in the engines (nothing here compares numbers computed by the model)."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time

import httpx
import pytest

from server_helpers import REPO, ServerThread, start_serve_subprocess
from mla_export.server.access_log import PathFilter
from mla_export.server.metrics import buckets_1_2_5, parse_prometheus_text
from mla_export.server.startup import check_port
from mla_export.server.stats_log import SpecLine, StatsLine

PRECISION = "f32"
SECRET = "the secret prompt text 4242"


# ---- the stats line -----------------------------------------------------------------------------

def _stats(running=0, waiting=0, used=0, total=100, queries=0, hits=0):
    return {"num_running": running, "num_waiting": waiting, "kv_blocks_used": used, "kv_blocks_total": total,
            "prefix_cache_queries": queries, "prefix_cache_hits": hits}


def test_stats_line_from_known_counts():
    line = StatsLine()
    assert line.update(100.0, {"prompt_tokens": 50, "generation_tokens": 7}, _stats()) is None  # the baseline
    text = line.update(110.0, {"prompt_tokens": 1250, "generation_tokens": 462},
                       _stats(running=3, waiting=1, used=25, total=200, queries=400, hits=100))
    assert text == ("Avg prompt throughput: 120.0 tokens/s, Avg generation throughput: 45.5 tokens/s, "
                    "Running: 3 reqs, Waiting: 1 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 25.0%")
    # Idle after activity: one line showing it, then silence until something happens again.
    idle = line.update(115.0, {"prompt_tokens": 1250, "generation_tokens": 462}, _stats(queries=400, hits=100))
    assert idle.startswith("Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0")
    assert line.update(125.0, {"prompt_tokens": 1250, "generation_tokens": 462}, _stats()) is None
    assert line.update(135.0, {"prompt_tokens": 1250, "generation_tokens": 462}, _stats()) is None
    # Requests waiting but no token yet is activity too.
    assert "Waiting: 2 reqs" in line.update(140.0, {"prompt_tokens": 1250, "generation_tokens": 462},
                                            _stats(waiting=2))


def test_stats_line_with_empty_cache_and_no_lookups():
    line = StatsLine()
    line.update(0.0, {"prompt_tokens": 0, "generation_tokens": 0}, {})
    text = line.update(2.0, {"prompt_tokens": 0, "generation_tokens": 10}, {"kv_blocks_total": 0})
    assert text.endswith("Avg generation throughput: 5.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, "
                         "KV cache usage: 0.0%, Prefix cache hit rate: 0.0%")


def test_spec_decoding_line_from_known_counts():
    """vLLM's SpecDecoding line over the interval: 85 verify steps with 255 drafts, 120 accepted in 10 s."""
    spec = SpecLine()
    assert spec.update(5.0, {}) is None  # not speculating: no line, ever
    base = {"spec_decode_num_drafts": 15, "spec_decode_num_draft_tokens": 45, "spec_decode_num_accepted_tokens": 20,
            "spec_decode_num_accepted_tokens_per_pos": [10, 6, 4]}
    assert spec.update(100.0, base) is None  # the baseline
    now = {"spec_decode_num_drafts": 100, "spec_decode_num_draft_tokens": 300, "spec_decode_num_accepted_tokens": 140,
           "spec_decode_num_accepted_tokens_per_pos": [70, 46, 24]}
    assert spec.update(110.0, now) == (
        "SpecDecoding metrics: Mean acceptance length: 2.41, Accepted throughput: 12.00 tokens/s, "
        "Drafted throughput: 25.50 tokens/s, Accepted: 120 tokens, Drafted: 255 tokens, "
        "Per-position acceptance rate: 0.706, 0.471, 0.235, Avg Draft acceptance rate: 47.1%")
    assert spec.update(120.0, now) is None  # no verify step in the interval: no line


def test_vllm_token_buckets():
    assert buckets_1_2_5(100) == (1, 2, 5, 10, 20, 50, 100)
    assert buckets_1_2_5(4096) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


# ---- port and access log ---------------------------------------------------------------------------

def test_check_port_names_a_taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        msg = check_port("127.0.0.1", port)
        assert msg is not None and f"127.0.0.1:{port}" in msg and "in use" in msg.lower()
    assert check_port("127.0.0.1", port) is None  # released: free again
    assert check_port("127.0.0.1", 0) is None
    assert "does not resolve" in check_port("no-such-host.invalid", 8000)


def test_access_log_path_filter():
    f = PathFilter(["/health", "/metrics"])

    def rec(path):
        return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                                 ("127.0.0.1:5000", "GET", path, "1.1", 200), None)

    assert not f.filter(rec("/health")) and not f.filter(rec("/metrics?x=1"))
    assert f.filter(rec("/v1/completions"))


def test_serve_fails_at_once_on_a_taken_port(exports):
    model_dir = exports.tiny()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "serve", str(model_dir), "--port", str(port),
                               "--precision", PRECISION], cwd=REPO, capture_output=True, text=True, timeout=300)
        took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert f"127.0.0.1:{port}" in proc.stderr and "in use" in proc.stderr.lower()
    # The model never loaded: no start-up line (which comes after loading).
    assert "KV blocks" not in proc.stderr, (took, proc.stderr)


# ---- the serve command's logs ---------------------------------------------------------------------

def test_serve_logs_requests_access_and_memory_but_never_the_prompt(exports):
    model_dir = exports.tiny()
    proc, base = start_serve_subprocess(model_dir, "--precision", PRECISION, "--served-model-name", "tiny",
                                        "--log-stats-interval", "0.2", "--disable-access-log-for-endpoints", "/health")
    try:
        r = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": SECRET, "max_tokens": 5,
                                                       "ignore_eos": True, "n": 2}, timeout=300)
        assert r.status_code == 200
        time.sleep(1.0)  # a few stats intervals (the line is logged asynchronously)
        proc.terminate()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err += out  # uvicorn's access log goes to stdout, as vLLM's
    assert SECRET not in err
    start = next(line for line in err.splitlines() if "KV blocks of" in line)
    assert "GiB" in start and "weights" in start, start
    assert '"POST /v1/completions HTTP/1.1" 200' in err  # uvicorn's access log
    assert '"GET /health' not in err  # filtered out (start_serve_subprocess polls it)
    rid = r.json()["id"]
    for i in range(2):
        assert f"Received request {rid}-{i}: prompt tokens" in err
        assert f"Finished request {rid}-{i}: prompt tokens" in err and "output tokens 5, finish reason length" in err
    assert "Avg prompt throughput:" in err and "Avg generation throughput:" in err


def test_serve_logging_flags_turn_the_lines_off(exports):
    model_dir = exports.tiny()
    proc, base = start_serve_subprocess(model_dir, "--precision", PRECISION, "--disable-log-requests",
                                        "--disable-uvicorn-access-log", "--disable-log-stats",
                                        "--log-stats-interval", "0.2")
    try:
        r = httpx.post(f"{base}/v1/completions", json={"prompt": SECRET, "max_tokens": 3}, timeout=300)
        assert r.status_code == 200
        time.sleep(1.0)
        proc.terminate()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err += out
    assert "Received request" not in err and "Finished request" not in err
    assert "POST /v1/completions" not in err and "Avg prompt throughput" not in err
    assert SECRET not in err


# ---- vLLM's metrics on a live server ------------------------------------------------------------

@pytest.fixture(scope="module")
def server(exports):
    from mla_export.runtime import LLMEngine

    engine = LLMEngine(exports.tiny(), precision=PRECISION, max_num_seqs=4, max_num_batched_tokens=64)
    with ServerThread(engine, model_name="tiny", max_num_seqs=4, max_queue=64, log_requests=True) as srv:
        yield srv, engine


def _hist(v: dict, name: str) -> tuple[float, float]:
    """(count, sum) of a histogram with the model_name label."""
    return v[f'{name}_count{{model_name="tiny"}}'], v[f'{name}_sum{{model_name="tiny"}}']


def test_vllm_request_phase_and_param_metrics(server, caplog):
    srv, engine = server
    before = parse_prometheus_text(httpx.get(f"{srv.base}/metrics", timeout=30).text)
    names = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
             "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
             "vllm:e2e_request_latency_seconds", "vllm:request_params_max_tokens", "vllm:request_params_n",
             "vllm:request_max_num_generation_tokens", "vllm:iteration_tokens_total")
    start = {n: _hist(before, n) for n in names}
    with caplog.at_level(logging.INFO, logger="mla_export.server"):
        # 2 prompts x n=3 = 6 sequences (2 parents), plus one of n=1 (1 parent); every one runs to max_tokens.
        r1 = httpx.post(f"{srv.base}/v1/completions", json={"model": "tiny", "prompt": ["a b c", "d e"], "n": 3,
                                                            "max_tokens": 7, "ignore_eos": True}, timeout=300)
        r2 = httpx.post(f"{srv.base}/v1/completions", json={"model": "tiny", "prompt": SECRET, "max_tokens": 4,
                                                            "ignore_eos": True}, timeout=300)
    assert r1.status_code == r2.status_code == 200
    v = parse_prometheus_text(httpx.get(f"{srv.base}/metrics", timeout=30).text)
    d = {n: (_hist(v, n)[0] - start[n][0], _hist(v, n)[1] - start[n][1]) for n in names}
    for n in names[:5]:
        assert d[n][0] == 7, n  # one observation per sequence
    assert d["vllm:request_params_max_tokens"] == (7, 6 * 7 + 4)
    assert d["vllm:request_params_n"] == (3, 3 + 3 + 1)  # per prompt (vLLM's parent request)
    assert d["vllm:request_max_num_generation_tokens"] == (3, 7 + 7 + 4)
    # Every generated token (and every prompt once) is in exactly one step's iteration tokens.
    # (usage counts a prompt once; each of its n sequences prefills it)
    prompt_tokens = 3 * r1.json()["usage"]["prompt_tokens"] + r2.json()["usage"]["prompt_tokens"]
    generated = r1.json()["usage"]["completion_tokens"] + r2.json()["usage"]["completion_tokens"]
    assert d["vllm:iteration_tokens_total"][1] == prompt_tokens + generated
    # The phases add up: queue + inference = arrival to last token; prefill + decode = inference; and
    # the server's own end-to-end time (from its enqueueing, after the response) covers them.
    q, p, dec, inf, e2e = (d[n][1] for n in names[:5])
    assert inf == pytest.approx(p + dec, abs=1e-6)
    assert 0 <= q + inf <= e2e + 0.05 * 7  # one clock vs the other: a few ms per request apart at most
    assert q + inf >= 0.5 * e2e - 0.05 * 7
    # cache_config_info names the engine's cache.
    info = [k for k in v if k.startswith("vllm:cache_config_info{")]
    assert len(info) == 1 and v[info[0]] == 1.0
    kv = engine.kv_cache
    for label in (f'block_size="{kv.block_size}"', f'num_gpu_blocks="{kv.num_blocks}"',
                  f'cache_dtype="{engine.facts.cache_dtype}"', 'enable_prefix_caching="True"'):
        assert label in info[0], (label, info[0])
    # The request log: a received and a finished line per sequence, without the prompt.
    text = caplog.text
    assert text.count("Received request") == 7 and text.count("Finished request") == 7
    assert SECRET not in text
