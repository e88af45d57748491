"""The server against hostile requests: 400 (not 500) for a 5000-digit integer, deeply nested
JSON and lone UTF-16 surrogates; a huge prompt is refused or tokenized off the event loop, so
/health keeps answering meanwhile; a request the engine rejects fails alone. Tiny preset, f32."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from mla_export.runtime import LLMEngine
from server_helpers import ServerThread


@pytest.fixture(scope="module")
def server(exports):
    engine = LLMEngine(exports.tiny(), precision="f32", max_num_seqs=4, max_num_batched_tokens=64)
    with ServerThread(engine, model_name="tiny", max_num_seqs=4, max_queue=16) as srv:
        yield srv


def _post(server, path: str, raw: bytes) -> httpx.Response:
    return httpx.post(server.base + path, content=raw, headers={"content-type": "application/json"}, timeout=120)


@pytest.mark.parametrize("raw", [
    b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",
    b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"prompt": "a\\ud800b", "max_tokens": 2}',
    b'{"prompt": ["ok", "\\udfff"], "max_tokens": 2}',
], ids=["5000-digit-int", "nested", "lone-high-surrogate", "lone-low-surrogate"])
def test_hostile_completion_bodies_are_400(server, raw):
    r = _post(server, "/v1/completions", raw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_lone_surrogate_in_a_chat_message_is_400(server):
    raw = b'{"messages": [{"role": "user", "content": "x\\ud83d"}], "max_tokens": 2}'
    r = _post(server, "/v1/chat/completions", raw)
    assert r.status_code in (400, 404), r.text  # 404: the export has no chat template
    if r.status_code == 400:
        assert "surrogate" in r.json()["error"]["message"]


def test_paired_surrogates_are_text(server):
    r = _post(server, "/v1/completions", b'{"prompt": "a\\ud83d\\ude00b", "max_tokens": 2}')
    assert r.status_code == 200, r.text


def _health_while(server, send) -> tuple[list[float], object]:
    """Poll /health while send() runs in a thread: (latencies of the answers, send's result)."""
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", send()))
    lat = []
    with httpx.Client(timeout=120) as client:
        t.start()
        while t.is_alive():
            t0 = time.perf_counter()
            assert client.get(server.base + "/health").status_code == 200
            lat.append(time.perf_counter() - t0)
            time.sleep(0.02)
    t.join()
    return lat, result["r"]


def test_16mib_prompt_is_refused_while_health_answers(server):
    text = ("The quick brown fox jumps over the lazy dog. " * 400_000)[: (16 << 20) - 100]
    body = json.dumps({"prompt": text, "max_tokens": 4}).encode()
    lat, r = _health_while(server, lambda: _post(server, "/v1/completions", body))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
    print(f"16 MiB prompt: 400 after {len(lat)} /health answers, slowest {max(lat, default=0) * 1e3:.1f} ms")


def test_long_prompt_is_tokenized_off_the_event_loop(server):
    """With the length bound lifted, a 1 MiB prompt is really tokenized (about 5 s here, in the
    worker process): /health answers many times meanwhile (on the event loop it could not answer
    at all until the tokenizer returned)."""
    st = server.app.state.server
    limit, st.encoder.char_limit = st.encoder.char_limit, None
    try:
        text = ("The quick brown fox jumps over the lazy dog. " * 30_000)[: 1 << 20]
        body = json.dumps({"prompt": text, "max_tokens": 4}).encode()
        t0 = time.perf_counter()
        lat, r = _health_while(server, lambda: _post(server, "/v1/completions", body))
        took = time.perf_counter() - t0
    finally:
        st.encoder.char_limit = limit
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
    assert "tokens" in r.json()["error"]["message"]
    print(f"1 MiB prompt tokenized in {took:.1f} s; {len(lat)} /health answers meanwhile, slowest "
          f"{max(lat) * 1e3:.1f} ms")
    assert len(lat) >= 10


def test_a_request_the_engine_rejects_fails_alone(exports):
    """A request whose step fails (here: the metadata builder refuses its prompt [5, 7, 9], as a
    stand-in for any per-request failure) gets its own error; /health stays 200 and the next
    request is served (before: the engine loop died, /health and every later request answered
    503). The refusal matches that prompt whole: refusing any step holding token 7 also refused
    the next request whenever it sampled a 7 (a CI run did)."""
    engine = LLMEngine(exports.tiny(), precision="f32", max_num_seqs=4, max_num_batched_tokens=64)
    build = engine.builder.build

    def picky(*a, **k):
        ids = k.get("new_token_ids", a[3] if len(a) > 3 else None)
        if any(list(t) == [5, 7, 9] for t in ids):
            raise ValueError("token 7 refused")
        return build(*a, **k)

    engine.builder.build = picky
    with ServerThread(engine, model_name="tiny", max_num_seqs=4, max_queue=16) as srv:
        bad = httpx.post(srv.base + "/v1/completions", json={"prompt": [5, 7, 9], "max_tokens": 2}, timeout=120)
        assert bad.status_code >= 400 and "token 7 refused" in bad.text
        assert httpx.get(srv.base + "/health", timeout=30).status_code == 200
        good = httpx.post(srv.base + "/v1/completions", json={"prompt": [5, 6, 9], "max_tokens": 2}, timeout=120)
        assert good.status_code == 200, good.text
