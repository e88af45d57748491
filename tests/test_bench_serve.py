"""tools/bench_serve.py (mla_export/bench/serving/): vLLM's serving metrics on synthetic timestamps
with hand-computed answers, the SSE parsing of OpenAI-style and llama-server-style streams (usage
on its own chunk, on the closing chunk, on every chunk, or absent), the random text prompts, the
arrival schedule, the A/B summary, and smoke runs against a live tiny `mla-export serve` (f32)
checking counts and the result fields. No timing thresholds: only counts, shapes and arithmetic."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import numpy as np
import pytest

from mla_export.bench.serving.cli import main
from mla_export.bench.serving.client import RequestOutput, completion_payload, stream_completion
from mla_export.bench.serving.dataset import load_tokenizer, num_special_tokens_to_add, random_requests, special_ids
from mla_export.bench.serving.metrics import calculate_metrics, peak_figures
from mla_export.bench.serving.report import markdown, summarize
from mla_export.bench.serving.runner import arrival_times
from mla_export.bench.serving.sse import SSEDecoder, parse_completion_event
from server_helpers import ServerThread

PRECISION = "f32"  # the live server's; nothing here compares values across precisions


def _out(start, ttft, itl, n_out, prompt_len=10, ok=True):
    o = RequestOutput(success=ok, start_time=start, ttft=ttft, itl=list(itl), output_tokens=n_out,
                      prompt_len=prompt_len, latency=ttft + sum(itl))
    return o


# ---- metrics ------------------------------------------------------------------------------------

def test_metrics_on_synthetic_timestamps():
    outs = [
        _out(0.00, 0.10, [0.02, 0.03, 0.05], 4),          # latency 0.20, TPOT 0.10/3
        _out(0.05, 0.20, [0.04], 5),                       # 5 tokens in 2 chunks (usage): TPOT 0.04/4
        _out(0.20, 0.15, [], 1),                           # one token: no TPOT, no ITL
        _out(0.30, 0.0, [], 0, ok=False),                  # failed: counted apart
    ]
    m = calculate_metrics(outs, duration_s=2.0, percentiles=[50, 99, 99.9])
    assert (m["completed"], m["failed"]) == (3, 1)
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 10
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(5.0)
    assert m["total_token_throughput"] == pytest.approx(20.0)
    # TTFT: 0.10, 0.20, 0.15 s
    assert m["mean_ttft_ms"] == pytest.approx(150.0)
    assert m["median_ttft_ms"] == pytest.approx(150.0)
    assert m["std_ttft_ms"] == pytest.approx(1000 * math.sqrt((0.05**2 + 0.05**2) / 3))
    # linear percentile: rank 0.99 * 2 = 1.98 between 0.15 and 0.20
    assert m["p99_ttft_ms"] == pytest.approx(1000 * (0.15 + 0.98 * 0.05))
    assert m["p99.9_ttft_ms"] == pytest.approx(1000 * (0.15 + 0.998 * 0.05))
    # TPOT: (E2EL - TTFT) / (tokens - 1), only requests with more than one token
    tpots = [0.10 / 3, 0.04 / 4]
    assert m["mean_tpot_ms"] == pytest.approx(1000 * sum(tpots) / 2)
    assert m["median_tpot_ms"] == pytest.approx(1000 * sum(tpots) / 2)
    # ITL: every chunk gap of every request, pooled: 0.02 0.03 0.05 0.04
    assert m["mean_itl_ms"] == pytest.approx(35.0)
    assert m["median_itl_ms"] == pytest.approx(35.0)
    assert m["p50_itl_ms"] == pytest.approx(35.0)
    assert m["p99_itl_ms"] == pytest.approx(1000 * (0.04 + 0.97 * 0.01))  # rank 2.97 of [.02 .03 .04 .05]
    # E2EL: 0.20, 0.24, 0.15
    assert m["mean_e2el_ms"] == pytest.approx(1000 * 0.59 / 3)
    assert m["median_e2el_ms"] == pytest.approx(200.0)
    # 7 token chunks, all in the first second; the first request ends at 0.20 as the third starts
    assert m["max_output_tokens_per_s"] == 7
    assert m["max_concurrent_requests"] == 2


def test_metrics_selected_percentile_metrics_and_empty_runs():
    m = calculate_metrics([_out(0, 0.1, [], 0, ok=False)], 1.0, [99], percentile_metrics=("ttft",))
    assert m["completed"] == 0 and m["failed"] == 1 and m["request_throughput"] == 0
    assert m["mean_ttft_ms"] == 0 and m["p99_ttft_ms"] == 0  # vLLM: an empty series counts as 0
    assert not any(k.endswith(("_tpot_ms", "_itl_ms", "_e2el_ms")) for k in m)
    assert peak_figures([]) == (0.0, 0)
    with pytest.raises(ValueError, match="duration"):
        calculate_metrics([], 0.0, [99])
    with pytest.raises(ValueError, match="percentile-metrics"):
        calculate_metrics([], 1.0, [99], percentile_metrics=("ttft", "goodput"))


def test_peak_tokens_per_second_buckets():
    # chunks at 0.5, 0.9 | 1.2, 1.4, 1.6 | 2.1 -> the busiest second holds 3
    o = _out(0.0, 0.5, [0.4, 0.3, 0.2, 0.2, 0.5], 6)
    assert peak_figures([o]) == (3.0, 1)


# ---- SSE ----------------------------------------------------------------------------------------

def test_sse_decoder_reassembles_events_across_reads():
    body = ('data: {"choices":[{"text":"é","finish_reason":null}]}\r\n\r\n'
            ': keep-alive comment\n\n'
            'event: message\ndata: {"a":\ndata: 1}\n\n'
            'data: [DONE]').encode()
    d = SSEDecoder()
    got = []
    for i in range(0, len(body), 3):  # 3-byte reads split the 2-byte 'é' and every line
        got += d.feed(body[i:i + 3])
    got += d.close()
    assert got == ['{"choices":[{"text":"é","finish_reason":null}]}', '{"a":\n1}', "[DONE]"]


def test_parse_openai_style_stream():
    tok = parse_completion_event('{"choices":[{"index":0,"text":" hi","finish_reason":null}]}')
    assert tok.is_token and tok.text == " hi" and tok.usage is None
    last = parse_completion_event('{"choices":[{"index":0,"text":"!","finish_reason":"length"}]}')
    assert last.is_token and last.finish_reason == "length"
    usage = parse_completion_event('{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":8}}')
    assert not usage.is_token and usage.usage == {"prompt_tokens": 3, "completion_tokens": 8}
    special = parse_completion_event('{"choices":[{"text":"","finish_reason":null}]}')
    assert special.is_token  # vLLM: a chunk with choices is a token even when its text is empty
    assert parse_completion_event("[DONE]").done


def test_parse_llama_server_style_stream():
    # running usage on a partial chunk, then the closing chunk: empty text + finish_reason + usage
    part = parse_completion_event('{"choices":[{"text":"ab cd","index":0,"logprobs":null,"finish_reason":null}],'
                                  '"object":"text_completion","usage":{"completion_tokens":2,"prompt_tokens":9},'
                                  '"timings":{"predicted_n":2}}')
    assert part.is_token and part.text == "ab cd" and part.usage["completion_tokens"] == 2
    final = parse_completion_event('{"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],'
                                   '"usage":{"completion_tokens":8,"prompt_tokens":9,"total_tokens":17}}')
    assert not final.is_token and final.finish_reason == "length" and final.usage["completion_tokens"] == 8


def test_parse_errors_in_stream():
    e = parse_completion_event('{"error":{"message":"context full","code":400}}')
    assert e.error and "context full" in e.error
    assert "not JSON" in parse_completion_event("{nope").error
    assert "not a JSON object" in parse_completion_event("[1, 2]").error


# ---- one request through the client, on recorded wire formats ----------------------------------

def _replay(events: list[str]) -> httpx.AsyncClient:
    """An httpx client whose transport answers with these SSE events (the wire format under test)."""
    body = "".join(f"data: {e}\n\n" for e in events).encode()

    def handler(request):
        assert json.loads(request.content)["stream_options"] == {"include_usage": True}
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


@pytest.fixture(scope="module")
def tok(exports):
    return load_tokenizer(exports.tiny())


def _request(client, tok) -> RequestOutput:
    async def go():
        async with client:
            return await stream_completion(client, "http://x/v1/completions",
                                           completion_payload("m", "p", 8, True, None), 5, tok)
    return asyncio.run(go())


def test_client_counts_llama_server_tokens_from_the_closing_usage(tok):
    o = _request(_replay([
        '{"choices":[{"text":"ab","finish_reason":null}],"usage":{"completion_tokens":1,"prompt_tokens":9}}',
        '{"choices":[{"text":"cd ef","finish_reason":null}],"usage":{"completion_tokens":5,"prompt_tokens":9}}',
        '{"choices":[{"text":"","finish_reason":"length"}],"usage":{"completion_tokens":8,"prompt_tokens":9}}',
        "[DONE]"]), tok)
    assert o.success and o.output_tokens == 8 and o.output_tokens_from == "usage"
    assert o.prompt_len == 9  # the server's count replaces the client's
    assert len(o.itl) == 1  # two token chunks; the closing chunk is no token
    assert o.generated_text == "abcd ef" and o.finish_reason == "length"


def test_client_tokenizes_when_no_usage_comes(tok):
    o = _request(_replay(['{"choices":[{"text":"hello","finish_reason":null}]}',
                          '{"choices":[{"text":" world","finish_reason":"stop"}]}', "[DONE]"]), tok)
    assert o.success and o.output_tokens_from == "tokenizer" and o.prompt_len == 5
    assert o.output_tokens == len(tok.encode("hello world", add_special_tokens=False).ids)


def test_client_reports_failures(tok):
    no_token = _request(_replay(['{"choices":[],"usage":{"completion_tokens":0}}', "[DONE]"]), tok)
    assert not no_token.success and "without a token" in no_token.error
    err = _request(_replay(['{"choices":[{"text":"a","finish_reason":null}]}', '{"error":{"message":"boom"}}']), tok)
    assert not err.success and "boom" in err.error
    refused = _request(httpx.AsyncClient(transport=httpx.MockTransport(
        lambda r: httpx.Response(400, json={"error": {"message": "bad max_tokens", "param": "max_tokens"}}))), tok)
    assert not refused.success and refused.error.startswith("HTTP 400") and "max_tokens" in refused.error


def test_a_connection_closed_before_any_answer_is_retried_once(tok):
    """cpp-httplib (llama-server) closes a keep-alive connection after a few requests: the request
    never reached it, so it is sent again once; a second such failure is reported."""
    calls = []

    def flaky(times):
        def handler(request):
            calls.append(1)
            if len(calls) <= times:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            return httpx.Response(200, content=b'data: {"choices":[{"text":"a","finish_reason":"stop"}]}\n\n'
                                               b"data: [DONE]\n\n", headers={"content-type": "text/event-stream"})
        return httpx.AsyncClient(transport=httpx.MockTransport(handler))

    o = _request(flaky(1), tok)
    assert o.success and len(calls) == 2
    calls.clear()
    o = _request(flaky(2), tok)
    assert not o.success and "disconnected" in o.error and len(calls) == 2


def test_token_id_prompts_send_the_same_tokens(tok):
    reqs, _ = random_requests(tok, 4, input_len=24, output_len=5, seed=3)
    for r in reqs:
        assert r.payload_prompt("text") == r.prompt and r.payload_len("text") == r.prompt_len
        ids = r.payload_prompt("token-ids")
        assert ids == tok.encode(r.prompt, add_special_tokens=False).ids and r.payload_len("token-ids") == len(ids)


# ---- prompts and arrivals -----------------------------------------------------------------------

def test_random_text_prompts_have_the_target_token_length(tok):
    n_special = num_special_tokens_to_add(tok)
    assert n_special == 1  # the tiny export's tokenizer adds BOS
    reqs, mismatch = random_requests(tok, 12, input_len=24, output_len=5, seed=3)
    specials = special_ids(tok)
    for r in reqs:
        ids = tok.encode(r.prompt, add_special_tokens=True).ids
        assert len(ids) == r.prompt_len and r.expected_output_len == 5  # the real length is the one reported
        assert not specials & set(ids[n_special:])  # no special token drawn into the text
    # a byte-level BPE may not round-trip within vLLM's 10 tries: the slack is reported, not hidden
    assert mismatch == sum(r.prompt_len - 24 for r in reqs)
    assert any(r.prompt_len == 24 for r in reqs)
    again, _ = random_requests(tok, 12, input_len=24, output_len=5, seed=3)
    assert [r.prompt for r in again] == [r.prompt for r in reqs]
    other, _ = random_requests(tok, 12, input_len=24, output_len=5, seed=4)
    assert [r.prompt for r in other] != [r.prompt for r in reqs]


def test_random_lengths_follow_the_range_ratio(tok):
    reqs, _ = random_requests(tok, 40, input_len=21, output_len=10, range_ratio=0.5, seed=1)
    assert all(10 + 1 <= r.prompt_len <= 30 + 1 for r in reqs)  # floor(20*.5)..ceil(20*1.5), + BOS
    assert all(5 <= r.expected_output_len <= 15 for r in reqs)
    assert len({r.expected_output_len for r in reqs}) > 1
    with pytest.raises(ValueError, match="random-input-len"):
        random_requests(tok, 2, input_len=1, output_len=4)
    with pytest.raises(ValueError, match="range-ratio"):
        random_requests(tok, 2, input_len=8, output_len=4, range_ratio=1.0)


def test_arrival_times():
    assert arrival_times(5, float("inf"), 1.0, np.random.default_rng(0)) == [0.0] * 5
    t = arrival_times(50, 4.0, 1.0, np.random.default_rng(0))
    assert all(b >= a for a, b in zip(t, t[1:])) and t[-1] == pytest.approx(50 / 4.0)
    with pytest.raises(ValueError):
        arrival_times(3, 0.0, 1.0, np.random.default_rng(0))


# ---- the A/B summary ----------------------------------------------------------------------------

def _run(label, rnd, conc, thr, ttft):
    return {"label": label, "round": rnd, "max_concurrency": conc, "completed": 4, "failed": 0,
            "request_throughput": thr, "output_throughput": 8 * thr, "total_token_throughput": 24 * thr,
            "mean_ttft_ms": ttft, "median_ttft_ms": ttft, "std_ttft_ms": 0.0, "p99_ttft_ms": ttft}


def test_summary_medians_and_paired_ratios():
    runs = [_run("A", 0, 1, 2.0, 10.0), _run("B", 0, 1, 1.0, 40.0),
            _run("A", 1, 1, 3.0, 30.0), _run("B", 1, 1, 2.0, 20.0),
            _run("A", 2, 1, 8.0, 20.0), _run("B", 2, 1, 2.0, 10.0)]
    s = summarize(runs, ["A", "B"])
    a = next(p for p in s["points"] if p["label"] == "A")
    assert a["rounds"] == 3 and a["median"]["request_throughput"] == 3.0
    assert (a["min"]["request_throughput"], a["max"]["request_throughput"]) == (2.0, 8.0)
    r = s["ratios"][0]
    assert r["pairs"] == 3
    assert r["median_ratio_a_over_b"]["request_throughput"] == 2.0  # median of 2, 1.5, 4
    assert r["median_ratio_a_over_b"]["median_ttft_ms"] == 1.5  # median of 0.25, 1.5, 2
    assert "std_ttft_ms" not in r["median_ratio_a_over_b"]
    table = markdown(s, [99])
    assert "| 1 | A/B |" in table and "2x" in table and "TTFT p99 ms" in table


# ---- the command line ---------------------------------------------------------------------------

@pytest.mark.parametrize("args, flag", [
    (["--max-concurrency", "2", "--sweep-concurrency", "1,2"], "--sweep-concurrency"),
    (["--sweep-concurrency", "1,0"], "--sweep-concurrency"),
    (["--metric-percentiles", "0"], "--metric-percentiles"),
    (["--percentile-metrics", "ttft,goodput"], "--percentile-metrics"),
    (["--backend", "vllm"], "--backend"),
    (["--endpoint", "/v1/chat/completions"], "--endpoint"),
    (["--num-prompts", "0"], "--num-prompts"),
    (["--request-rate", "0"], "--request-rate"),
    (["--label-b", "x"], "--label-b"),
    (["--extra-body", "[1]"], "--extra-body"),
])
def test_cli_refuses_bad_flags_by_name(args, flag, tok, exports, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--tokenizer", str(exports.tiny()), *args])
    assert e.value.code == 2 and flag in capsys.readouterr().err


def test_cli_refuses_a_missing_tokenizer(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--tokenizer", str(tmp_path)])
    assert "--tokenizer" in capsys.readouterr().err


def test_an_unreachable_server_is_a_clear_failure(tmp_path, exports, capsys):
    from server_helpers import free_port

    rc = main(["--tokenizer", str(exports.tiny()), "--base-url", f"http://127.0.0.1:{free_port()}", "--label", "gone",
               "--num-prompts", "1", "--random-input-len", "8", "--random-output-len", "2",
               "--result-dir", str(tmp_path)])
    assert rc == 1 and "gone: cannot reach" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no result file for a run that did not happen


# ---- live: the tool against a tiny `mla-export serve` -------------------------------------------

@pytest.fixture(scope="module")
def live(exports):
    from mla_export.runtime import LLMEngine

    model_dir = exports.tiny()
    engine = LLMEngine(model_dir, precision=PRECISION, max_num_seqs=4, max_num_batched_tokens=128)
    with ServerThread(engine, model_name="tiny", max_num_seqs=4, max_queue=64) as srv:
        yield srv, model_dir


VLLM_FIELDS = {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
               "output_throughput", "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
               "request_rate", "burstiness", "max_concurrency", "model_id", "num_prompts", "backend", "label",
               *(f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl", "e2el"))}


def test_smoke_run_against_a_live_server(live, tmp_path, capsys):
    srv, model_dir = live
    md = tmp_path / "serve.md"
    rc = main(["--tokenizer", str(model_dir), "--base-url", srv.base, "--label", "ours", "--num-prompts", "4",
               "--max-concurrency", "2", "--random-input-len", "16", "--random-output-len", "8", "--temperature", "0",
               "--seed", "5", "--result-dir", str(tmp_path), "--result-filename", "serve.json", "--markdown", str(md)])
    assert rc == 0
    doc = json.loads((tmp_path / "serve.json").read_text())
    assert {"schema", "protocol", "machine", "config", "targets", "runs", "summary"} <= set(doc)
    [run] = doc["runs"]
    assert VLLM_FIELDS <= set(run), VLLM_FIELDS - set(run)
    assert (run["completed"], run["failed"], run["num_prompts"], run["max_concurrency"]) == (4, 0, 4, 2)
    assert run["model_id"] == "tiny" and run["request_rate"] == "inf"
    assert run["total_output_tokens"] == 4 * 8  # ignore_eos: every request makes its 8 tokens
    # the server's own prompt counts (usage) agree with the client's tokenizer on the same prompts
    drawn, _ = random_requests(load_tokenizer(model_dir), 4, input_len=16, output_len=8, seed=5)
    assert run["total_input_tokens"] == sum(r.prompt_len for r in drawn)
    assert run["output_tokens_from"] == {"usage": 4, "tokenizer": 0}
    assert 1 <= run["max_concurrent_requests"] <= 2
    assert "input_lens" not in run  # per-request arrays only with --save-detailed
    assert "| 2 | ours |" in md.read_text()
    assert "Successful requests:" in capsys.readouterr().out


def test_ab_sweep_alternates_targets_on_shared_prompts(live, tmp_path):
    srv, model_dir = live
    rc = main(["--tokenizer", str(model_dir), "--base-url", srv.base, "--label", "a", "--base-url-b", srv.base,
               "--label-b", "b", "--num-prompts", "2", "--sweep-concurrency", "1,2", "--rounds", "2",
               "--num-warmups", "1", "--random-input-len", "8", "--random-output-len", "3", "--save-detailed",
               "--result-dir", str(tmp_path), "--result-filename", "ab.json"])
    assert rc == 0
    doc = json.loads((tmp_path / "ab.json").read_text())
    order = [(r["round"], r["max_concurrency"], r["label"]) for r in doc["runs"]]
    assert order == [(0, 1, "a"), (0, 1, "b"), (0, 2, "a"), (0, 2, "b"), (1, 1, "a"), (1, 1, "b"), (1, 2, "a"), (1, 2, "b")]
    runs = doc["runs"]
    for a, b in zip(runs[::2], runs[1::2]):
        assert a["seed"] == b["seed"] and a["generated_texts"] and a["input_lens"] == b["input_lens"]
    assert len({r["seed"] for r in runs}) == 4  # fresh prompts for every (round, concurrency)
    assert all(r["completed"] == 2 and r["total_output_tokens"] == 6 for r in runs)
    ratios = doc["summary"]["ratios"]
    assert [r["max_concurrency"] for r in ratios] == [1, 2] and all(r["pairs"] == 2 for r in ratios)
