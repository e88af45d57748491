"""`mla-export serve` end to end: real clients (the official `openai` package, httpx) against a
live server on loopback, the real engine on a tiny export, results compared with offline
`LLM.generate` on the same export."""

from __future__ import annotations

import json
import signal
import threading

import httpx
import jinja2
import openai
import pytest
from tokenizers import Tokenizer

from server_helpers import ServerThread, metrics, openai_client, start_serve_subprocess, wait_until

PRECISION = "f32"  # the same in the server and the offline engine
PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a small model",
    "User: What is the capital of France? Assistant:",
    "A paged cache keeps the keys and values of every sequence in fixed-size blocks, and",
    "Numbers too: 0 1 2 3",
    "def add(a, b):",
]
LONG = 400  # tokens of a request that must still be running while the test acts on it
API_KEY = "test-key-123"
TINY_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def model_dir(exports):
    return exports.tiny()


@pytest.fixture(scope="module")
def offline(model_dir):
    from mla_export import LLM

    return LLM(model_dir, precision=PRECISION)


@pytest.fixture(scope="module")
def server(model_dir):
    from mla_export.runtime import LLMEngine

    engine = LLMEngine(model_dir, precision=PRECISION, max_num_seqs=8, max_num_batched_tokens=128)
    srv = ServerThread(engine, model_name="tiny", max_num_seqs=8, max_queue=256)
    with srv:
        yield srv
    final = srv.app.state.server.final_stats
    assert final["kv_blocks_used"] == 0 and final["num_running"] == 0 and final["num_waiting"] == 0


@pytest.fixture(scope="module")
def small_server(model_dir):
    """One running sequence, no queue (429 as soon as it is busy), an API key, a custom chat template."""
    from mla_export.runtime import LLMEngine

    engine = LLMEngine(model_dir, precision=PRECISION, max_num_seqs=1, max_num_batched_tokens=64)
    srv = ServerThread(engine, model_name="tiny-small", max_num_seqs=1, max_queue=0, api_key=API_KEY,
                       chat_template=TINY_TEMPLATE)
    with srv:
        yield srv


client = openai_client


def offline_greedy(offline, prompts, max_tokens):
    return offline.generate(prompts, max_tokens=max_tokens, temperature=0.0)


# ---- completions -------------------------------------------------------------------------------

def test_models_and_health(server):
    c = client(server)
    models = c.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(f"{server.base}/health").json() == {"status": "ok"}


def test_completion_equals_offline(server, offline):
    want = offline_greedy(offline, PROMPTS, 24)
    c = client(server)
    for prompt, w in zip(PROMPTS, want):
        r = c.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                 extra_body={"return_token_ids": True})
        assert r.object == "text_completion" and len(r.choices) == 1
        ch = r.choices[0]
        assert ch.token_ids == w.token_ids
        assert ch.text == w.text
        assert ch.finish_reason == w.finish_reason
        assert r.usage.prompt_tokens == len(w.prompt_token_ids)
        assert r.usage.completion_tokens == len(w.token_ids)
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_from_token_ids_and_batch_of_prompts(server, offline):
    ids = [[0, 5, 17, 33, 80, 121], [0, 200, 3, 3, 9]]
    want = offline_greedy(offline, ids, 12)
    r = client(server).completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0,
                                          extra_body={"return_token_ids": True})
    got = sorted(r.choices, key=lambda c: c.index)
    assert [c.index for c in got] == [0, 1]
    assert [c.token_ids for c in got] == [w.token_ids for w in want]
    assert r.usage.prompt_tokens == sum(len(x) for x in ids)


def test_streamed_completion(server, offline):
    prompt = PROMPTS[1]
    [want] = offline_greedy(offline, [prompt], 32)
    stream = client(server).completions.create(model="tiny", prompt=prompt, max_tokens=32, temperature=0,
                                               stream=True, stream_options={"include_usage": True},
                                               extra_body={"return_token_ids": True})
    text, ids, reasons, usage = "", [], [], None
    chunks = 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            chunks += 1
            text += ch.text
            ids += ch.token_ids
            if ch.finish_reason is not None:
                reasons.append(ch.finish_reason)
    assert ids == want.token_ids and text == want.text
    assert reasons == [want.finish_reason]
    assert chunks > 1  # streamed, not one block
    assert usage.completion_tokens == len(want.token_ids) and usage.prompt_tokens == len(want.prompt_token_ids)


def test_sse_wire_format(server):
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert all(p["object"] == "text_completion" for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_stop_strings_and_stop_token_ids(server, offline):
    [full] = offline_greedy(offline, [PROMPTS[2]], 40)
    assert len(full.text) > 4
    stop = full.text[2:4]  # a string that certainly occurs in the greedy output
    cut = full.text.index(stop)
    c = client(server)
    r = c.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=40, temperature=0, stop=[stop])
    assert r.choices[0].text == full.text[:cut] and r.choices[0].finish_reason == "stop"
    # Streamed, the held-back tail never leaks past the stop string.
    text = "".join(ch.text for chunk in c.completions.create(
        model="tiny", prompt=PROMPTS[2], max_tokens=40, temperature=0, stop=stop, stream=True) for ch in chunk.choices)
    assert text == full.text[:cut]
    # A stop token id ends the choice on that token (and keeps it, as the engine does).
    tok = full.token_ids[3]
    r = c.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=40, temperature=0,
                             extra_body={"stop_token_ids": [tok], "return_token_ids": True})
    k = full.token_ids.index(tok)
    assert r.choices[0].token_ids == full.token_ids[:k + 1] and r.choices[0].finish_reason == "stop"


def test_n_choices_seeded_sampling_equals_offline(server, offline):
    from mla_export.runtime import SamplingParams

    prompt = PROMPTS[0]
    r = client(server).completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0.9, top_p=0.95,
                                          n=3, seed=1234, extra_body={"return_token_ids": True})
    got = sorted(r.choices, key=lambda c: c.index)
    assert [c.index for c in got] == [0, 1, 2]
    # Choice i draws with seed + i: the same as offline with those seeds.
    params = [SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=1234 + i) for i in range(3)]
    want = offline.generate([prompt] * 3, sampling_params=params)
    assert [c.token_ids for c in got] == [w.token_ids for w in want]
    assert len({tuple(c.token_ids) for c in got}) > 1  # different seeds, different samples
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in got)
    # Greedy n=2: both choices are the greedy continuation.
    [g] = offline_greedy(offline, [prompt], 10)
    r = client(server).completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0, n=2,
                                          extra_body={"return_token_ids": True})
    assert [c.token_ids for c in r.choices] == [g.token_ids, g.token_ids]


# ---- chat ---------------------------------------------------------------------------------------

def _render(template: str, model_dir, messages) -> list[int]:
    """The prompt ids, rendered independently of the server (plain jinja2 + the tokenizer)."""
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    m = json.loads((model_dir / "mla_graph.json").read_text())["model"]
    text = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token=tok.id_to_token(m["bos_token_id"]),
        eos_token=tok.id_to_token(m["eos_token_ids"][0]))
    return tok.encode(text, add_special_tokens=False).ids


def test_chat_with_the_models_template(server, offline, model_dir):
    graph = json.loads((model_dir / "mla_graph.json").read_text())
    assert graph["chat_template"], "the tiny export records a chat template"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    ids = _render(graph["chat_template"], model_dir, messages)
    [want] = offline_greedy(offline, [ids], 20)
    c = client(server)
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    assert r.usage.prompt_tokens == len(ids)
    # Streamed: a role delta first, then the content.
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason


def test_chat_with_a_custom_template(small_server, offline, model_dir):
    messages = [{"role": "user", "content": "hello, world"}]
    ids = _render(TINY_TEMPLATE, model_dir, messages)
    [want] = offline_greedy(offline, [ids], 12)
    r = client(small_server, api_key=API_KEY).chat.completions.create(
        model="tiny-small", messages=messages, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == want.text
    assert r.usage.prompt_tokens == len(ids)


# ---- concurrency, metrics ---------------------------------------------------------------------

def test_32_concurrent_streams_then_all_blocks_free(server, offline):
    jobs = [(PROMPTS[i % len(PROMPTS)], 8 + 5 * (i % 7)) for i in range(32)]
    want = {}
    for max_tokens in sorted({m for _, m in jobs}):
        ps = [p for p, m in jobs if m == max_tokens]
        for p, w in zip(ps, offline_greedy(offline, ps, max_tokens)):
            want[(p, max_tokens)] = w
    results: list = [None] * len(jobs)
    errors: list = []
    barrier = threading.Barrier(len(jobs))

    def worker(i, prompt, max_tokens):
        try:
            c = client(server)
            barrier.wait()
            ids, text, reason = [], "", None
            for chunk in c.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                              stream=True, extra_body={"return_token_ids": True}):
                for ch in chunk.choices:
                    ids += ch.token_ids
                    text += ch.text
                    reason = ch.finish_reason or reason
            results[i] = (ids, text, reason)
        except Exception as e:  # reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=worker, args=(i, p, m)) for i, (p, m) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (p, m), got in zip(jobs, results):
        w = want[(p, m)]
        assert got == (w.token_ids, w.text, w.finish_reason), (p, m)
    # Every stream has ended: nothing runs, nothing waits, every block is free, and /metrics says so.
    mt = metrics(server.base)
    assert mt["mla_num_requests_running"] == 0 and mt["mla_num_requests_waiting"] == 0
    assert mt["mla_server_requests_in_flight"] == 0
    assert mt["mla_kv_blocks_used"] == 0
    assert mt["mla_kv_blocks_free"] == mt["mla_kv_blocks_total"] > 0
    # The same prompts came back many times: the prefix cache was hit.
    assert mt["mla_prefix_cache_hits_total"] > 0 and 0 < mt["mla_prefix_cache_hit_rate"] <= 1
    assert mt["mla_generation_tokens_total"] >= sum(len(r[0]) for r in results)
    assert mt["mla_time_to_first_token_seconds_count"] >= 32


# ---- cancellation, 429, 401 --------------------------------------------------------------------

def _long_stream(srv, headers, max_tokens=LONG):
    body = {"model": "tiny-small", "prompt": PROMPTS[0], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True}
    return httpx.stream("POST", f"{srv.base}/v1/completions", json=body, headers=headers, timeout=300)


def _aborted(mt) -> float:
    return mt.get('mla_request_finished_total{finish_reason="abort",model="tiny-small"}', 0.0)


AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_client_disconnect_aborts_and_frees_blocks(small_server):
    before = _aborted(metrics(small_server.base))
    with _long_stream(small_server, AUTH) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        seen = 0
        for line in lines:
            if line.startswith("data: "):
                seen += 1
                if seen == 3:
                    break
        mt = metrics(small_server.base)
        assert mt["mla_num_requests_running"] == 1 and mt["mla_kv_blocks_used"] > 0
    # Leaving the block closed the connection mid-stream.
    mt = wait_until(lambda: (m := metrics(small_server.base)) and _aborted(m) == before + 1 and m, "the abort")
    wait_until(lambda: metrics(small_server.base)["mla_kv_blocks_used"] == 0, "the blocks to be freed")
    mt = metrics(small_server.base)
    assert mt["mla_num_requests_running"] == 0 and mt["mla_server_requests_in_flight"] == 0
    # The server keeps serving.
    r = client(small_server, api_key=API_KEY).completions.create(model="tiny-small", prompt="hello", max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_client_disconnect_without_streaming_aborts(small_server):
    import socket

    before = _aborted(metrics(small_server.base))
    body = json.dumps({"model": "tiny-small", "prompt": PROMPTS[0], "max_tokens": LONG, "temperature": 0,
                       "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", small_server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_until(lambda: metrics(small_server.base)["mla_num_requests_running"] == 1, "the request to run")
    # The socket is closed before any answer: the request is aborted, its blocks freed.
    wait_until(lambda: _aborted(metrics(small_server.base)) == before + 1, "the abort")
    wait_until(lambda: metrics(small_server.base)["mla_kv_blocks_used"] == 0, "the blocks to be freed")
    assert metrics(small_server.base)["mla_server_requests_in_flight"] == 0


def test_queue_full_is_429_at_once(small_server):
    c = client(small_server, api_key=API_KEY)
    with _long_stream(small_server, AUTH) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # (kept referenced: dropping the iterator would close the connection)
        next(line for line in lines if line.startswith("data: "))  # it runs
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model="tiny-small", prompt="hello", max_tokens=4)
        assert e.value.status_code == 429
        assert e.value.body["code"] == "queue_full" and e.value.response.headers.get("retry-after")
        raw = httpx.post(f"{small_server.base}/v1/chat/completions", headers=AUTH, timeout=60,
                         json={"model": "tiny-small", "messages": [{"role": "user", "content": "hi"}]})
        assert raw.status_code == 429 and raw.json()["error"]["message"]
    wait_until(lambda: metrics(small_server.base)["mla_server_requests_in_flight"] == 0, "the stream's abort")
    r = c.completions.create(model="tiny-small", prompt="hello", max_tokens=4)
    assert r.choices[0].text is not None
    assert metrics(small_server.base)['mla_request_rejected_total{model="tiny-small",reason="queue_full"}'] >= 2


def test_api_key(small_server):
    body = {"model": "tiny-small", "prompt": "hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}, {"Authorization": "Basic x"}):
        r = httpx.post(f"{small_server.base}/v1/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{small_server.base}/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        client(small_server, api_key="nope").completions.create(model="tiny-small", prompt="hi", max_tokens=2)
    r = client(small_server, api_key=API_KEY).completions.create(model="tiny-small", prompt="hi", max_tokens=2)
    assert len(r.choices) == 1
    # Probes and scrapers need no key.
    assert httpx.get(f"{small_server.base}/health").status_code == 200
    assert httpx.get(f"{small_server.base}/metrics").status_code == 200


# ---- bad requests ---------------------------------------------------------------------------

BAD = [
    (b"{not json", None),
    (b"", None),
    (b"[1, 2]", None),
    (json.dumps({"prompt": "hi", "max_tokens": "ten"}), "max_tokens"),
    (json.dumps({"prompt": "hi", "max_tokens": 0}), "max_tokens"),
    (json.dumps({"prompt": "hi", "max_tokens": 2.5}), "max_tokens"),
    (json.dumps({"prompt": "hi", "temperature": -1}), "temperature"),
    (json.dumps({"prompt": "hi", "temperature": "hot"}), "temperature"),
    (json.dumps({"prompt": "hi", "top_p": 1.5}), "top_p"),
    (json.dumps({"prompt": "hi", "n": 0}), "n"),
    (json.dumps({"prompt": "hi", "n": 1000}), "n"),
    (json.dumps({"prompt": "hi", "seed": "x"}), "seed"),
    (json.dumps({"prompt": "hi", "stream": "yes"}), "stream"),
    (json.dumps({"prompt": "hi", "stop": 5.5}), "stop"),
    (json.dumps({"prompt": "hi", "stop": [""]}), "stop"),
    (json.dumps({"prompt": 12}), "prompt"),
    (json.dumps({"prompt": []}), "prompt"),
    (json.dumps({"prompt": [1, "a"]}), "prompt"),
    (json.dumps({"prompt": [1, 2, 100000]}), "prompt"),
    (json.dumps({"max_tokens": 3}), "prompt"),
    (json.dumps({"prompt": list(range(5, 105)) * 6}), "prompt"),  # 600 tokens > the 512 context
    (json.dumps({"prompt": list(range(5, 105)) * 5, "max_tokens": 100}), "max_tokens"),  # 500 + 100 > 512
    (json.dumps({"prompt": "hi", "logprobs": 30}), "logprobs"),
    (json.dumps({"prompt": "hi", "presence_penalty": 3.0}), "presence_penalty"),
    (json.dumps({"prompt": "hi", "guided_json": {"type": "frob"}}), "guided_json"),
    (json.dumps({"prompt": "hi", "min_tokens": 20, "max_tokens": 4}), "min_tokens"),
    (json.dumps({"prompt": "hi", "stream_options": {"include_usage": True}}), "stream_options"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_completion_requests_are_400(server, body, param):
    r = httpx.post(f"{server.base}/v1/completions", content=body, headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param
    assert httpx.get(f"{server.base}/health").status_code == 200


def test_bad_chat_requests_and_other_errors(server):
    post = lambda path, body: httpx.post(f"{server.base}{path}", json=body, timeout=60)  # noqa: E731
    for body, param in [({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
                        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.[0].role"),
                        ({"messages": [{"role": "user", "content": 3}]}, "messages.[0].content"),
                        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -2}, "max_tokens"),
                        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10_000}, "max_tokens")]:
        r = post("/v1/chat/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    r = post("/v1/completions", {"model": "other-model", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(f"{server.base}/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
    r = httpx.get(f"{server.base}/v2/nothing")
    assert r.status_code == 404 and "error" in r.json()
    with pytest.raises(openai.BadRequestError):
        client(server).completions.create(model="tiny", prompt="hi", max_tokens=10_000)
    # Still serving, with the same results.
    r = client(server).completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert metrics(server.base)['mla_request_rejected_total{model="tiny",reason="bad_request"}'] > 0


# ---- the command, graceful shutdown ----------------------------------------------------------

def _read_sse(lines):
    ids, reason = [], None
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            d = json.loads(line[6:])
            for ch in d.get("choices", []):
                ids += ch.get("token_ids", [])
                reason = ch.get("finish_reason") or reason
    return ids, reason


def test_serve_command_graceful_shutdown_finishes_running_requests(model_dir, offline):
    proc, base = start_serve_subprocess(model_dir, "--precision", PRECISION, "--served-model-name", "tiny",
                                        "--max-num-seqs", "4", "--shutdown-timeout", "120")
    try:
        body = {"model": "tiny", "prompt": PROMPTS[3], "max_tokens": 64, "temperature": 0, "stream": True,
                "return_token_ids": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            proc.send_signal(signal.SIGTERM)  # mid-stream
            ids, reason = _read_sse(lines)
        ids = json.loads(first[6:])["choices"][0]["token_ids"] + ids
        [want] = offline_greedy(offline, [PROMPTS[3]], 64)
        assert (ids, reason) == (want.token_ids, want.finish_reason)  # it finished, not cut
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "kv_blocks_used=0" in err


def test_serve_command_shutdown_timeout_cancels_and_frees(model_dir):
    proc, base = start_serve_subprocess(model_dir, "--precision", PRECISION, "--served-model-name", "tiny",
                                        "--max-num-seqs", "1", "--shutdown-timeout", "0", "--api-key", API_KEY)
    try:
        assert httpx.post(f"{base}/v1/completions", json={"prompt": "x"}, timeout=60).status_code == 401
        body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": LONG, "temperature": 0, "stream": True,
                "ignore_eos": True, "return_token_ids": True}
        got_reason = "unset"
        with httpx.stream("POST", f"{base}/v1/completions", json=body, headers=AUTH, timeout=300) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            proc.send_signal(signal.SIGTERM)
            try:
                ids, got_reason = _read_sse(lines)
            except httpx.HTTPError:
                got_reason = None  # the connection was cut
        assert got_reason != "length"  # cancelled: it did not run to max_tokens
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "kv_blocks_used=0" in err and "running=0" in err


def test_logprobs_penalties_and_vllm_extras_equal_the_offline_engine(server, offline):
    """logprobs / top_logprobs (both APIs, streamed and not), penalties, logit_bias and vLLM's extras
    reach the engine: the same numbers as LLM.generate with the same SamplingParams."""
    from mla_export import SamplingParams

    c = client(server)
    prompt = "The quick brown fox"
    want = offline.generate(prompt, SamplingParams(temperature=0.0, max_tokens=6, logprobs=3, ignore_eos=True,
                                                   presence_penalty=1.5, frequency_penalty=0.5,
                                                   repetition_penalty=1.3, logit_bias={7: 3.0}))[0].outputs[0]
    extra = dict(ignore_eos=True, repetition_penalty=1.3)
    r = c.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                             presence_penalty=1.5, frequency_penalty=0.5, logit_bias={"7": 3.0}, extra_body=extra)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([e[t].logprob for e, t in zip(want.logprobs, want.token_ids)], abs=1e-6)
    assert lp.tokens == [e[t].decoded_token for e, t in zip(want.logprobs, want.token_ids)]
    # the top 3 and the sampled token, keyed by their text (tokens of one text share a key, as in OpenAI's format)
    for top, e in zip(lp.top_logprobs, want.logprobs):
        assert set(top) == {x.decoded_token for x in e.values()}
    assert r.choices[0].text == want.text
    streamed = c.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                    presence_penalty=1.5, frequency_penalty=0.5, logit_bias={"7": 3.0},
                                    extra_body=extra, stream=True)
    got = [x for chunk in streamed for x in (chunk.choices[0].logprobs.token_logprobs if chunk.choices and
                                              chunk.choices[0].logprobs else [])]
    assert got == pytest.approx(lp.token_logprobs, abs=1e-6)
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=5,
                                     temperature=0, logprobs=True, top_logprobs=2, extra_body=dict(ignore_eos=True))
    content = chat.choices[0].logprobs.content
    assert len(content) == 5 and all(len(t.top_logprobs) == 2 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in content)
    assert all(t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in content)  # greedy: the best one


def test_echo_and_prompt_logprobs_equal_the_offline_engine(server, offline):
    """lm-evaluation-harness' loglikelihood request (echo, logprobs, max_tokens 0 or 1, token-id
    prompts) and vLLM's prompt_logprobs: the engine's prompt logprobs, streamed and not."""
    from mla_export import SamplingParams

    c = client(server)
    ids = offline.get_tokenizer().encode("The quick brown fox jumps").ids
    want = offline.generate([ids], SamplingParams(temperature=0.0, max_tokens=1, logprobs=2, prompt_logprobs=2))[0]
    own = [None] + [e[t].logprob for e, t in zip(want.prompt_logprobs[1:], ids[1:])]
    for max_tokens in (0, 1):
        r = c.completions.create(model="tiny", prompt=ids, max_tokens=max_tokens, temperature=0, logprobs=2,
                                 echo=True)
        lp, text = r.choices[0].logprobs, r.choices[0].text
        assert lp.token_logprobs[:len(ids)] == pytest.approx(own, abs=1e-6)
        assert lp.top_logprobs[0] is None and all(len(t) >= 2 for t in lp.top_logprobs[1:])
        assert len(lp.tokens) == len(ids) + max_tokens and r.usage.completion_tokens == max_tokens
        assert text.startswith(offline.get_tokenizer().decode(ids))
        if max_tokens:
            gen = want.outputs[0]
            assert lp.token_logprobs[-1] == pytest.approx(gen.logprobs[0][gen.token_ids[0]].logprob, abs=1e-6)
            assert text.endswith(gen.text)
    streamed = list(c.completions.create(model="tiny", prompt="The quick brown fox jumps", max_tokens=2,
                                         temperature=0, logprobs=0, echo=True, stream=True))
    got = [x for ch in streamed if ch.choices and ch.choices[0].logprobs for x in ch.choices[0].logprobs.token_logprobs]
    assert got[:len(ids)] == pytest.approx(own, abs=1e-6) and len(got) == len(ids) + 2
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices).startswith("The quick brown fox jumps")
    # vLLM's prompt_logprobs: {token id: {logprob, rank, decoded_token}} per prompt token
    r = c.completions.create(model="tiny", prompt=ids, max_tokens=1, temperature=0,
                             extra_body={"prompt_logprobs": 1})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for entry, t, w in zip(plp[1:], ids[1:], want.prompt_logprobs[1:]):
        assert entry[str(t)]["logprob"] == pytest.approx(w[t].logprob, abs=1e-6)
        assert any(v["rank"] == 1 for v in entry.values())
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                     extra_body={"prompt_logprobs": 0})
    assert chat.model_extra["prompt_logprobs"][0] is None and len(chat.model_extra["prompt_logprobs"]) > 1


def test_bad_words_allowed_token_ids_and_truncation_equal_the_offline_engine(server, offline):
    from mla_export import SamplingParams

    c = client(server)
    free = offline.generate("Hello", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    tok = offline.get_tokenizer()
    # a generated token whose text is a word encoding to that token alone: banning it must change the answer
    word = next(s for t in free.token_ids if (s := tok.decode([t])).isprintable() and s.strip() == s and s
                and tok.encode(s, add_special_tokens=False).ids == [t])
    want = offline.generate("Hello", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                    bad_words=[word]))[0].outputs[0]
    r = c.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0,
                             extra_body=dict(ignore_eos=True, bad_words=[word], return_token_ids=True))
    assert r.choices[0].model_extra["token_ids"] == want.token_ids != free.token_ids
    r = c.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=0.9, seed=1,
                             extra_body=dict(allowed_token_ids=[5, 6, 7], return_token_ids=True, ignore_eos=True))
    assert set(r.choices[0].model_extra["token_ids"]) <= {5, 6, 7}
    ids = list(range(3, 40))
    r = c.completions.create(model="tiny", prompt=ids, max_tokens=4, temperature=0,
                             extra_body=dict(truncate_prompt_tokens=5, return_token_ids=True))
    tail = offline.generate([ids[-5:]], SamplingParams(temperature=0.0, max_tokens=4))[0].outputs[0]
    assert r.usage.prompt_tokens == 5 and r.choices[0].model_extra["token_ids"] == tail.token_ids
    for extra, param in ((dict(allowed_token_ids=[10**7]), None), (dict(bad_words=[""]), "bad_words"),
                         (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens")):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="tiny", prompt="Hello", max_tokens=2, extra_body=extra)
        if param:
            assert e.value.body["param"] == param
        else:
            assert "allowed_token_ids" in e.value.body["message"]


def test_min_tokens_and_include_stop_str_in_output(server, offline):
    from mla_export import SamplingParams

    c = client(server)
    free = offline.generate("Hello", SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0].outputs[0]
    stop = free.text[4:7]
    r = c.completions.create(model="tiny", prompt="Hello", max_tokens=20, temperature=0, stop=[stop],
                             extra_body=dict(ignore_eos=True, include_stop_str_in_output=True))
    assert r.choices[0].text == free.text[:free.text.index(stop) + len(stop)]
    r = c.completions.create(model="tiny", prompt="Hello", max_tokens=8, temperature=0,
                             extra_body=dict(min_tokens=8, stop_token_ids=[free.token_ids[0]]))
    assert r.usage.completion_tokens == 8  # the stop token is held back until min_tokens
