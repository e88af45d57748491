"""Chat completions' `echo` as vLLM has it: the last message's content comes back before the
reply when that message has the reply's role (a partial assistant answer the model continues,
with add_generation_prompt false), streamed as its own chunk right after the role chunk and
joined in the non-streamed message; nothing is echoed when the last message is the user's.
The tiny preset export (its own chat template), f32, a live server."""

from __future__ import annotations

import json

import httpx
import pytest

from server_helpers import ServerThread

PARTIAL = "The answer begins"


@pytest.fixture(scope="module")
def server(exports):
    from mla_export.runtime import LLMEngine

    engine = LLMEngine(exports.tiny(), precision="f32", max_num_seqs=4)
    with ServerThread(engine, model_name="tiny") as srv:
        yield srv


def _chat(srv, stream: bool, echo: bool, agp: bool, last_role: str = "assistant") -> str:
    messages = [{"role": "user", "content": "Say something"}]
    if last_role == "assistant":
        messages.append({"role": "assistant", "content": PARTIAL})
    body = {"model": "tiny", "messages": messages, "max_tokens": 6, "temperature": 0, "echo": echo,
            "add_generation_prompt": agp, "stream": stream}
    r = httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["choices"][0]["message"]["content"]
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    return "".join(d.get("content") or "" for d in deltas)


class TestChatEcho:
    @pytest.mark.parametrize("stream", [False, True])
    def test_partial_assistant_message_comes_back_whole(self, server, stream):
        plain = _chat(server, stream, echo=False, agp=False)
        echoed = _chat(server, stream, echo=True, agp=False)
        assert echoed == PARTIAL + plain

    def test_streamed_echo_is_the_chunk_after_the_role(self, server):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": PARTIAL}],
                "max_tokens": 3, "temperature": 0, "echo": True, "add_generation_prompt": False, "stream": True}
        r = httpx.post(f"{server.base}/v1/chat/completions", json=body, timeout=120)
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert chunks[1]["choices"][0]["delta"] == {"content": PARTIAL}

    def test_nothing_echoed_after_a_user_message(self, server):
        plain = _chat(server, False, echo=False, agp=True, last_role="user")
        assert _chat(server, False, echo=True, agp=True, last_role="user") == plain

    def test_not_a_bool(self, server):
        r = httpx.post(f"{server.base}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "x"}], "echo": "yes"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
