"""tool_choice "required" and a named function on `mla-export serve`, as vLLM serves them: the
output is forced by a JSON-schema constraint built from the tools (structured outputs on
llguidance) and returned as tool calls, with no tool-call parser configured.

f32 tiny export with random weights and the official `openai` client: the model's own
preference is noise, so calls whose arguments parse and validate (jsonschema) against the tool's
parameters do so because of the constraint. Schemas are bounded (maxLength, enums, integer
ranges, additionalProperties false) and JSON whitespace is off (vLLM's structured_outputs
option disable_any_whitespace, which joins the tool's constraint) so outputs finish in a few
dozen tokens. Streamed argument fragments are checked to add up to the non-streamed arguments
(greedy), and a full round trip sends the calls and a tool result back.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from mla_export import LLM, SamplingParams
from mla_export.runtime import LLMEngine
from server_helpers import ServerThread, openai_client

PRECISION = "f32"
MAX_TOKENS = 96  # more than any forced call below takes on the tiny model
NO_WS = {"structured_outputs": {"disable_any_whitespace": True}}

# A template that renders the tools' names and the tool-call turns (DeepSeek-V3's layout, simplified;
# the tiny model's 512-token context has no room for the schemas).
TEMPLATE = (
    "{{ bos_token }}{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.role == 'assistant' and m.tool_calls is defined %}<｜Assistant｜>"
    "{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments }}){% endfor %}<｜end▁of▁sentence｜>"
    "{% elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>"
    "{% elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}")


def obj(props: dict, required: list | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


def tool(name: str, params: dict | None) -> dict:
    f = {"name": name, "description": f"the {name} tool"}
    if params is not None:
        f["parameters"] = params
    return {"type": "function", "function": f}


TOOLS = [
    tool("get_weather", obj({"city": {"type": "string", "maxLength": 6},
                             "unit": {"enum": ["celsius", "fahrenheit"]}}, required=["city"])),
    tool("add", obj({"a": {"type": "integer", "minimum": 0, "maximum": 99},
                     "b": {"type": "integer", "minimum": 0, "maximum": 99}})),
    tool("set_flags", obj({"flags": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 2},
                           "on": {"type": "boolean"}})),
    tool("move", {"$defs": {"pt": obj({"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                      "y": {"type": "integer", "minimum": 0, "maximum": 9}})},
                  **obj({"to": {"$ref": "#/$defs/pt"}})}),
    tool("ping", None),  # no parameters: the arguments are an empty object
]
PARAMS = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object", "properties": {},
                                                                      "additionalProperties": False}
          for t in TOOLS}
USER = [{"role": "user", "content": "Use a tool."}]


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def check_call(call, name: str | None = None) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert name is None or call.function.name == name
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, PARAMS[call.function.name])
    return args


@pytest.fixture(scope="module")
def model_dir(exports):
    return exports.tiny()


@pytest.fixture(scope="module")
def server(model_dir):
    """No --enable-auto-tool-choice, no --tool-call-parser: forcing needs neither (as in vLLM)."""
    engine = LLMEngine(model_dir, precision=PRECISION, max_num_seqs=4, max_num_batched_tokens=256)
    srv = ServerThread(engine, model_name="tiny", max_num_seqs=4, chat_template=TEMPLATE)
    with srv:
        yield srv
    final = srv.app.state.server.final_stats
    assert final["kv_blocks_used"] == 0 and final["num_running"] == 0


client = openai_client


def create(srv, **kw):
    kw = {"extra_body": NO_WS, "messages": USER, "tools": TOOLS, "max_tokens": MAX_TOKENS, "temperature": 0, **kw}
    return client(srv).chat.completions.create(model="tiny", **kw)


def streamed(srv, **kw) -> tuple[dict[int, dict], str | None, str]:
    """The stream's tool calls by index ({id, name, arguments} joined from the deltas), its
    finish_reason and its content."""
    calls: dict[int, dict] = {}
    reason, content = None, ""
    for chunk in create(srv, stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or ():
                if d.index not in calls:  # the first delta of a call carries its id and name
                    assert d.id and d.type == "function" and d.function.name, d
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                else:
                    assert d.id is None and not d.function.name, d
                calls[d.index]["arguments"] += d.function.arguments or ""
            reason = ch.finish_reason or reason
    return calls, reason, content


# ---- reading the array of calls as it grows (no model) --------------------------------------------

def test_required_calls_read_as_they_grow():
    """Every prefix of an output reads as calls that only ever extend the previous reading (so a
    stream is the difference of consecutive readings), and the whole output as the final calls."""
    from mla_export.server.forced_tools import RequiredCalls

    text = ('[{"name":"get_weather","parameters":{"city":"Pa\\"ri}","unit":"celsius"}},'
            ' {"parameters": {"flags": ["x", {"y": "]"}], "n": -12.5e1}, "name": "set_flags"},'
            '{"name":"ping","parameters":{}}]')
    want = [("get_weather", '{"city":"Pa\\"ri}","unit":"celsius"}'),
            ("set_flags", '{"flags": ["x", {"y": "]"}], "n": -12.5e1}'), ("ping", "{}")]
    parser, before = RequiredCalls(), []
    for k in range(len(text) + 1):
        got = parser.parse(text[:k], False)
        assert got.content == ""
        assert len(got.calls) >= len(before)
        for old, new in zip(before, got.calls):
            assert new.name == old.name and new.arguments.startswith(old.arguments), (k, old, new)
        before = got.calls
    final = parser.parse(text, True)
    assert final.content == "" and [(c.name, c.arguments) for c in final.calls] == want
    assert all(json.loads(a) == json.loads(text)[i]["parameters"] for i, (_, a) in enumerate(want))
    for cut in (text[:-1], text[:40], "[]", '[{"name":"ping"}]', "{}"):  # not a complete array of calls
        assert parser.parse(cut, True).content == cut and parser.parse(cut, True).calls == []


# ---- the premise ----------------------------------------------------------------------------------

def test_without_the_constraint_the_model_writes_no_json(model_dir):
    llm = LLM(model_dir, precision=PRECISION)
    for prompt in ("Use a tool.", "[{"):
        (out,) = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24))
        with pytest.raises(ValueError):
            json.loads(out.outputs[0].text)


# ---- named function --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [t["function"]["name"] for t in TOOLS])
def test_named_function(server, name):
    r = create(server, tool_choice=named(name))
    ch = r.choices[0]
    assert ch.finish_reason == "stop"  # vLLM (after OpenAI): a named call finishes with "stop"
    assert ch.message.content == "" and len(ch.message.tool_calls) == 1  # vLLM's empty content
    check_call(ch.message.tool_calls[0], name)
    calls, reason, content = streamed(server, tool_choice=named(name))
    assert reason == "stop" and content == "" and list(calls) == [0]
    assert calls[0]["name"] == name and calls[0]["arguments"] == ch.message.tool_calls[0].function.arguments


def test_named_function_sampled_n(server):
    """n choices, each with its own grammar state in the engine, each a valid call."""
    r = create(server, tool_choice=named("get_weather"), n=3, temperature=1.0, seed=5)
    assert len(r.choices) == 3 and len({ch.message.tool_calls[0].id for ch in r.choices}) == 3
    for ch in r.choices:
        assert ch.finish_reason == "stop"
        check_call(ch.message.tool_calls[0], "get_weather")


# ---- required -----------------------------------------------------------------------------------------
# The array takes any number of calls and a random model does not stop adding them on its own
# (greedy repeats a call forever), so single-call arrays (parallel_tool_calls false: maxItems 1)
# are the bounded case; parallel calls are drawn with seeds until some array completes.

def test_required(server):
    r = create(server, tool_choice="required", parallel_tool_calls=False)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == ""
    assert len(ch.message.tool_calls) == 1
    check_call(ch.message.tool_calls[0])
    calls, reason, content = streamed(server, tool_choice="required", parallel_tool_calls=False)
    assert reason == "tool_calls" and content == ""
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == \
        [(c.function.name, c.function.arguments) for c in ch.message.tool_calls]


def test_required_sampled_n(server):
    """n choices, each with its own grammar state in the engine, each a valid call."""
    r = create(server, tool_choice="required", parallel_tool_calls=False, n=4, temperature=1.0, seed=11)
    assert len(r.choices) == 4
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls", ch
        assert len(ch.message.tool_calls) == 1
        check_call(ch.message.tool_calls[0])


def test_required_parallel_calls(server):
    several = 0
    for seed in range(8):
        kw = {"tool_choice": "required", "temperature": 1.0, "seed": seed, "max_tokens": 160}
        ch = create(server, **kw).choices[0]
        if ch.finish_reason == "length":  # still adding calls: the unfinished array is returned as text
            assert ch.message.tool_calls is None and ch.message.content.startswith("[{")
            continue
        assert ch.finish_reason == "tool_calls" and ch.message.content == ""
        for c in ch.message.tool_calls:
            check_call(c)
        assert len({c.id for c in ch.message.tool_calls}) == len(ch.message.tool_calls)
        calls, reason, _ = streamed(server, **kw)  # the same seed: the same tokens, streamed
        assert reason == "tool_calls" and sorted(calls) == list(range(len(ch.message.tool_calls)))
        assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == \
            [(c.function.name, c.function.arguments) for c in ch.message.tool_calls]
        several += len(ch.message.tool_calls) > 1
    assert several, "no draw completed an array of several calls"


def test_truncated_forced_output(server):
    r = create(server, tool_choice="required", max_tokens=3)
    ch = r.choices[0]  # the array did not complete: its text comes back, no calls
    assert ch.finish_reason == "length" and ch.message.tool_calls is None and ch.message.content.startswith("[")
    calls, reason, content = streamed(server, tool_choice="required", max_tokens=3)
    assert reason == "length" and content == "" and calls == {}  # no call's name was complete
    r = create(server, tool_choice=named("get_weather"), max_tokens=3)
    ch = r.choices[0]  # the named call's arguments are what was generated (vLLM's rule)
    assert ch.finish_reason == "length" and ch.message.tool_calls[0].function.arguments.startswith("{")
    calls, reason, _ = streamed(server, tool_choice=named("get_weather"), max_tokens=3)
    assert reason == "length" and calls[0]["arguments"] == ch.message.tool_calls[0].function.arguments


# ---- round trip -------------------------------------------------------------------------------------

def test_round_trip(server):
    first = create(server, tool_choice=named("add"))
    msg = first.choices[0].message
    args = check_call(msg.tool_calls[0], "add")
    history = USER + [msg.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": str(args["a"] + args["b"])}]
    assert history[1]["content"] == "" and history[1]["tool_calls"][0]["function"]["name"] == "add"
    r = create(server, messages=history, tool_choice="none", max_tokens=8)
    ch = r.choices[0]
    assert ch.message.tool_calls is None and isinstance(ch.message.content, str) and r.usage.completion_tokens > 0
    # the answer continues the rendered conversation: the prompt holds the call and the result
    tok = httpx.post(f"{server.base}/tokenize", json={"model": "tiny", "messages": history, "tools": TOOLS,
                                                      "return_token_strs": False}, timeout=60).json()
    assert tok["count"] == r.usage.prompt_tokens
    again = create(server, messages=history, tool_choice="required", parallel_tool_calls=False)
    check_call(again.choices[0].message.tool_calls[0])


# ---- refused ---------------------------------------------------------------------------------------------

BAD = [
    ({"tool_choice": named("nope")}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": named("add"), "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}}}}, "response_format.json_schema.schema"),
    ({"tool_choice": "required", "structured_outputs": {"regex": "a+"}}, "structured_outputs.regex"),
    ({"tool_choice": named("add"), "guided_json": {"type": "object"}}, "guided_json"),
    ({"tool_choice": named("bad"), "tools": [tool("bad", {"type": "frob"})]}, "tools.[0].function.parameters"),
    ({"tool_choice": "required", "tools": [tool("a", {"$defs": {"p": {"type": "integer"}}, "type": "object"}),
                                           tool("b", {"$defs": {"p": {"type": "string"}}, "type": "object"})]},
     "tools"),
]


@pytest.mark.parametrize("extra, param", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_refused(server, extra, param):
    body = {"messages": USER, "tools": TOOLS, "max_tokens": 4, **extra}
    r = httpx.post(f"{server.base}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


def test_required_with_no_tools_is_none(server):
    """OpenAI's rule, as vLLM: "required" with an empty tools list acts as "none"."""
    r = httpx.post(f"{server.base}/v1/chat/completions",
                   json={"messages": USER, "tools": [], "tool_choice": "required", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert "tool_calls" not in msg and isinstance(msg["content"], str)
