"""Tool calling and reasoning outputs on `mla-export serve`, as vLLM serves them.

What the live tests prove (f32, the tiny export with random weights, the official `openai` client):
the tool fields are accepted, validated (400s naming the field) and rendered into the prompt by
a DeepSeek-V3-style template (prompt ids equal an independent jinja2 render, and /tokenize);
a full round trip (assistant tool_calls + tool result) is rendered and answered; with the
parsers on, an output that holds no markup comes back unchanged (equal to offline greedy
generation), and with thinking on the whole output is returned as `reasoning`.
A random model never writes a tool call by itself, so the parsing of real tool-call outputs is
shown by feeding recorded model outputs, tokenized by the export's tokenizer (with the markers
added as tokens), through the server's own response path: the detokenizer (`_Detok`), the
streamed chunk and non-streamed choice builders (`chat_delta`, `chat_choice`) and the response
bodies, each validated by the openai client's own response models.
"""

from __future__ import annotations

import json

import httpx
import jinja2
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from tokenizers import Tokenizer

from server_helpers import ServerThread, openai_client

PRECISION = "f32"
MAX_TOKENS = 12

# DeepSeek-V3's chat layout (its tool calls and tool outputs as its official template writes
# them) plus a tools section in the system prompt (as vLLM's DeepSeek-V3 tool template does).
TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}## Tools\n"
    "{% for t in tools %}### {{ t.function.name }}\nDescription: {{ t.function.description }}\n"
    "Parameters: {{ t.function.parameters | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}"
    "{% elif m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.role == 'assistant' and m.tool_calls is defined %}<｜Assistant｜>{{ m.content or '' }}<｜tool▁calls▁begin｜>"
    "{% for c in m.tool_calls %}{{ '<｜tool▁call▁begin｜>' + c.type + '<｜tool▁sep｜>' + c.function.name"
    " + '\n```json\n' + c.function.arguments + '\n```<｜tool▁call▁end｜>' }}{% endfor %}"
    "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    "{% elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>"
    "{% elif m.role == 'tool' %}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m.content }}"
    "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% if thinking %}<think>{% else %}</think>{% endif %}{% endif %}")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
USER = [{"role": "user", "content": "Weather in Paris?"}]
ARGS = '{"city": "Paris"}'  # json.dumps's spacing: what the server's arguments mapping prints
ROUND_TRIP = USER + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18°C"}]


@pytest.fixture(scope="module")
def model_dir(exports):
    return exports.tiny()


@pytest.fixture(scope="module")
def offline(model_dir):
    from mla_export import LLM

    return LLM(model_dir, precision=PRECISION)


def _engine(model_dir):
    from mla_export.runtime import LLMEngine

    return LLMEngine(model_dir, precision=PRECISION, max_num_seqs=2, max_num_batched_tokens=512)


@pytest.fixture(scope="module")
def server(model_dir):
    """--enable-auto-tool-choice --tool-call-parser deepseek_v3 --reasoning-parser deepseek_v3."""
    with ServerThread(_engine(model_dir), model_name="tiny", max_num_seqs=2, chat_template=TOOLS_TEMPLATE,
                      tool_call_parser="deepseek_v3", enable_auto_tool_choice=True,
                      reasoning_parser="deepseek_v3") as srv:
        yield srv


@pytest.fixture(scope="module")
def plain_server(model_dir):
    """The same template, no parser flags."""
    with ServerThread(_engine(model_dir), model_name="tiny", max_num_seqs=1, chat_template=TOOLS_TEMPLATE) as srv:
        yield srv


client = openai_client


def oracle_ids(model_dir, messages, tools=None, **kw) -> list[int]:
    """The prompt rendered independently: plain jinja2 with transformers' tojson, call arguments
    as the client's JSON text."""
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    m = json.loads((model_dir / "mla_graph.json").read_text())["model"]
    env = jinja2.Environment()
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)  # transformers' tojson: keys in order
    text = env.from_string(TOOLS_TEMPLATE).render(
        messages=messages, tools=tools, add_generation_prompt=True, bos_token=tok.id_to_token(m["bos_token_id"]), **kw)
    return tok.encode(text, add_special_tokens=False).ids


def greedy(offline, ids):
    [out] = offline.generate([ids], max_tokens=MAX_TOKENS, temperature=0.0)
    return out


# ---- live: requests accepted, rendered, answered ---------------------------------------------------

def test_tools_are_rendered_and_plain_output_is_unchanged(server, offline, model_dir):
    c = client(server)
    with_tools, without = oracle_ids(model_dir, USER, TOOLS), oracle_ids(model_dir, USER)
    assert len(with_tools) > len(without)
    r = c.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=MAX_TOKENS, temperature=0)
    assert r.usage.prompt_tokens == len(with_tools)
    want = greedy(offline, with_tools)
    msg = r.choices[0].message
    assert msg.content == want.text and not msg.tool_calls  # no markup in the output: all of it is content
    assert r.choices[0].finish_reason == want.finish_reason
    r0 = c.chat.completions.create(model="tiny", messages=USER, max_tokens=MAX_TOKENS, temperature=0)
    assert r0.usage.prompt_tokens == len(without)
    # /tokenize renders tools the same way
    t = httpx.post(f"{server.base}/tokenize", json={"messages": USER, "tools": TOOLS}, timeout=60).json()
    assert t["tokens"] == with_tools
    # streamed: the same content, chunk by chunk
    chunks = list(c.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=MAX_TOKENS,
                                            temperature=0, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason


def test_round_trip_with_a_tool_result(server, offline, model_dir):
    ids = oracle_ids(model_dir, ROUND_TRIP, TOOLS)
    r = client(server).chat.completions.create(model="tiny", messages=ROUND_TRIP, tools=TOOLS,
                                               max_tokens=MAX_TOKENS, temperature=0)
    assert r.usage.prompt_tokens == len(ids), "the assistant's call and the tool's answer are in the prompt"
    assert r.choices[0].message.content == greedy(offline, ids).text


def test_reasoning_parser_follows_the_thinking_switch(server, offline, model_dir):
    c = client(server)
    ids = oracle_ids(model_dir, USER, thinking=True)
    want = greedy(offline, ids)
    assert "</think>" not in want.text
    r = c.chat.completions.create(model="tiny", messages=USER, max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"chat_template_kwargs": {"thinking": True}})
    assert r.usage.prompt_tokens == len(ids)
    msg = r.choices[0].message
    # thinking on, no </think> in the output: all of it is reasoning (deepseek_r1's rule)
    assert msg.content is None
    assert msg.reasoning_content == want.text and msg.reasoning == want.text
    chunks = list(c.chat.completions.create(model="tiny", messages=USER, max_tokens=MAX_TOKENS, temperature=0,
                                            stream=True, extra_body={"chat_template_kwargs": {"thinking": True}}))
    assert "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks) == want.text
    assert all(not ch.choices[0].delta.content for ch in chunks)
    # thinking off (the template closes </think> in the prompt): plain content
    r = c.chat.completions.create(model="tiny", messages=USER, max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].message.content == greedy(offline, oracle_ids(model_dir, USER)).text


def test_tool_choice_rules(server, plain_server):
    def post(srv, **body):
        return httpx.post(f"{srv.base}/v1/chat/completions", json={"messages": USER, "max_tokens": 2, **body}, timeout=60)

    # without --enable-auto-tool-choice: tools default to tool_choice "auto", refused as vLLM does
    for body in ({"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "auto"}):
        r = post(plain_server, **body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
        assert "--enable-auto-tool-choice" in r.json()["error"]["message"]
    r = post(plain_server, tools=TOOLS, tool_choice="none")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    # "required" and a named function need no parser flags (test_tool_choice.py)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        r = post(plain_server, tools=TOOLS, tool_choice=choice)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length", r.text
    for body, param in [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools.[0].type"),
        ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools.[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
         "tools.[0].function.parameters"),
        ({"tools": TOOLS + TOOLS}, "tools"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"messages": USER + [{"role": "tool", "content": "x"}]}, "messages.[1].tool_call_id"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
         "messages.[0].tool_calls.[0].function.arguments"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.[0].tool_calls"),
    ]:
        r = post(server, **body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert httpx.get(f"{server.base}/health").status_code == 200


def test_forced_tool_choice_with_the_parsers_on(server):
    """With --tool-call-parser and --reasoning-parser set, a forced tool_choice still goes by its
    constraint (from the first token: no thinking is split out, even with thinking on)."""
    pick = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"c": {"enum": ["a", "b"]}}, "required": ["c"], "additionalProperties": False}}}]
    c = client(server)
    for choice, finish in (({"type": "function", "function": {"name": "pick"}}, "stop"), ("required", "tool_calls")):
        r = c.chat.completions.create(model="tiny", messages=USER, tools=pick, tool_choice=choice, max_tokens=40,
                                      temperature=0, parallel_tool_calls=False,
                                      extra_body={"chat_template_kwargs": {"thinking": True},
                                                  "structured_outputs": {"disable_any_whitespace": True}})
        ch = r.choices[0]
        assert ch.finish_reason == finish and ch.message.content == "", ch
        assert getattr(ch.message, "reasoning_content", None) is None
        [call] = ch.message.tool_calls
        assert call.function.name == "pick" and json.loads(call.function.arguments)["c"] in ("a", "b")


def test_serve_flags_are_checked():
    from mla_export.cli import main

    assert main(["serve", "/nonexistent", "--enable-auto-tool-choice"]) == 2  # needs --tool-call-parser
    with pytest.raises(SystemExit):
        main(["serve", "/nonexistent", "--tool-call-parser", "nope"])


# ---- recorded outputs through the server's response path -------------------------------------------

DS_OUT = ("The user wants the weather.</think>Let me check. <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
          "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>"
          "function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Zürich 🏔\"}\n```<｜tool▁call▁end｜>"
          "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>")
KIMI_OUT = ("<think>Need weather.</think>On it.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>")
KIMI_SPECIAL = ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_end|>", "<|tool_call_argument_begin|>", "<|im_end|>"]


def _serve_recorded(tok, ids, make_output, decode, stream: bool, finish_reason="stop"):
    """The server's response path over recorded token ids: one engine output per token."""
    from mla_export.server import protocol as P
    from mla_export.server.deltas import Delta
    from mla_export.server.generation import _Choice, chat_choice, chat_delta, make_detok

    s = P.parse_chat_request({"messages": USER, "stream": stream}).sampling
    detok = make_detok(lambda t: tok.decode(t, skip_special_tokens=True), decode)  # as respond() makes it
    ch = _Choice(index=0, request_id="r", stop=[])
    ch.out = make_output()
    chunks = []
    sent = ""
    for k in range(1, len(ids) + 1):
        done = k == len(ids)
        # with the engine's own text, as the engine sends it (special tokens skipped, an incomplete
        # UTF-8 character held back until it is complete): what it adds to the text sent so far
        text = tok.decode(ids[:k], skip_special_tokens=True)
        if not done:
            text = text.rstrip("\ufffd")
        out = Delta("r", [ids[k - 1]], text[len(sent):], done, finish_reason if done else None,
                    text=text if done else None)
        sent = text
        ch.token_ids.append(ids[k - 1])
        delta = detok.advance(ch, out)
        ch.add_text(delta)
        if done:
            ch.finished, ch.finish_reason = True, finish_reason
        if stream and (d := chat_delta(ch, delta, [ids[k - 1]], None, s)) is not None:
            chunks.append(ChatCompletionChunk.model_validate(P.chat_chunk("id", "tiny", 0, [d])))
    if stream:
        return chunks
    return ChatCompletion.model_validate(P.chat_body("id", "tiny", 0, [chat_choice(ch, False)], P.usage(1, len(ids))))


def _accumulate(chunks):
    content, reasoning, calls = "", "", {}
    for c in chunks:
        d = c.choices[0].delta
        content += d.content or ""
        reasoning += getattr(d, "reasoning_content", None) or ""
        for tc in d.tool_calls or []:
            if tc.index not in calls:
                calls[tc.index] = [tc.id, tc.function.name, tc.function.arguments or ""]
            else:
                assert tc.id is None and tc.function.name is None
                calls[tc.index][2] += tc.function.arguments
    return content, reasoning, [calls[i] for i in sorted(calls)], chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("case", ["deepseek", "kimi"])
def test_recorded_tool_call_outputs_through_the_response_path(model_dir, case):
    from mla_export.server.chat_output import ChoiceOutput
    from mla_export.server.chat_tools import marker_decoder
    from mla_export.server.reasoning_parsers import ThinkSplitter
    from mla_export.server.tool_parsers import TOOL_PARSERS

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    plain = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731  (ServerState.decode)
    if case == "deepseek":  # DeepSeek's tool tokens are ordinary added tokens, its end of sentence is special
        tok.add_tokens(["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                        "<｜tool▁sep｜>", "</think>"])
        tok.add_special_tokens(["<｜end▁of▁sentence｜>"])
        text, parser, want_calls = DS_OUT, "deepseek_v3", [("get_weather", '{"city": "Paris"}'),
                                                           ("get_weather", '{"city": "Zürich 🏔"}')]
        want_content, want_reasoning = "Let me check. ", "The user wants the weather."
    else:  # Kimi's are special tokens: the server must keep them in the text for the parser
        tok.add_special_tokens(KIMI_SPECIAL + ["<think>", "</think>"])
        text, parser, want_calls = KIMI_OUT, "kimi_k2", [("get_weather", '{"city": "Paris"}')]
        want_content, want_reasoning = "On it.", "Need weather."
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) < len(text) / 2, "the markers are single tokens"
    cls = TOOL_PARSERS[parser]
    decode = marker_decoder(tok, ThinkSplitter.tokens + cls.tokens())  # None: the engine's text keeps them
    if case == "kimi":
        assert "<|tool_call_begin|>" not in plain(ids) and "<|tool_call_begin|>" in decode(ids)
        assert "<|im_end|>" not in decode(ids)
    else:
        assert decode is None and "<｜tool▁sep｜>" in plain(ids) and "<｜end▁of▁sentence｜>" not in plain(ids)
    make = lambda: ChoiceOutput(reasoning=ThinkSplitter(opens=True), tools=cls(TOOLS))  # noqa: E731

    r = _serve_recorded(tok, ids, make, decode, stream=False)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content == want_content and msg.reasoning_content == want_reasoning
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == want_calls
    assert all(c.type == "function" for c in msg.tool_calls)
    if case == "kimi":
        assert [c.id for c in msg.tool_calls] == ["functions.get_weather:0"]
    else:
        assert all(c.id.startswith("call_") for c in msg.tool_calls)

    content, reasoning, calls, finish = _accumulate(_serve_recorded(tok, ids, make, decode, stream=True))
    assert (content, reasoning, finish) == (want_content, want_reasoning, "tool_calls")
    assert [(name, args) for _, name, args in calls] == want_calls
    for marker in cls.tokens():
        assert marker not in content + reasoning + "".join(a for *_, a in calls)
