"""Tool-call and reasoning parsers on the real formats (vLLM's parser names), streamed and not:
feeding the text in pieces (one character at a time, and split in two at every boundary) gives
the same message as parsing it whole; malformed markup falls back to content; no markup leaks.
Pure text processing: no model, no precision involved."""

from __future__ import annotations

import json

import pytest

from mla_export.server.chat_output import ChoiceOutput
from mla_export.server.reasoning_parsers import ThinkSplitter, reasoning_splitter
from mla_export.server.tool_parsers import TOOL_PARSERS

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
TOOLS = [WEATHER, {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CB, DS_CE, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def ds_v3(name, args):
    return f"{DS_CB}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CE}"


def ds_v31(name, args):
    return f"{DS_CB}{name}{DS_SEP}{args}{DS_CE}"


def kimi(name, idx, args):
    return f"<|tool_call_begin|>functions.{name}:{idx}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


def glm(name, pairs, sep="\n"):
    return "<tool_call>" + name + sep + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                                             for k, v in pairs) + "</tool_call>"


def hermes(name, args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


A1, A2 = '{"city": "Paris", "days": 3}', '{"tz": "東京 🗼"}'
# (parser, text, content, [(name, arguments JSON)], Kimi-style ids or None)
CASES = [
    ("deepseek_v3", "Let me look that up." + DS_BEGIN + ds_v3("get_weather", A1) + "\n" + ds_v3("get_time", A2) + DS_END,
     "Let me look that up.", [("get_weather", A1), ("get_time", A2)], None),
    ("deepseek_v3", DS_BEGIN + ds_v3("get_weather", A1) + DS_END, None, [("get_weather", A1)], None),
    ("deepseek_v31", "好的。" + DS_BEGIN + ds_v31("get_weather", A1) + ds_v31("get_time", A2) + DS_END,
     "好的。", [("get_weather", A1), ("get_time", A2)], None),
    ("kimi_k2", "Checking.<|tool_calls_section_begin|>" + kimi("get_weather", 0, A1) + kimi("get_time", 1, A2)
     + "<|tool_calls_section_end|>", "Checking.", [("get_weather", A1), ("get_time", A2)],
     ["functions.get_weather:0", "functions.get_time:1"]),
    ("kimi_k2", "<|tool_calls_section_begin|>\n" + kimi("get_weather", 0, " " + A1 + "\n") + "\n<|tool_calls_section_end|>",
     None, [("get_weather", A1)], ["functions.get_weather:0"]),
    ("glm45", "I'll check.\n" + glm("get_weather", [("city", "Paris"), ("days", "3")]) + "\n"
     + glm("get_time", [("tz", "東京 🗼")], sep=""),
     "I'll check.\n", [("get_weather", '{"city": "Paris", "days": 3}'), ("get_time", '{"tz": "東京 🗼"}')], None),
    ("hermes", "Sure.\n" + hermes("get_weather", {"city": "Paris", "days": 3}) + "\n" + hermes("get_time", {"tz": "東京 🗼"}),
     "Sure.\n", [("get_weather", A1), ("get_time", A2)], None),
    # no markup at all: everything is content
    ("deepseek_v3", "Just text, <｜ not a call ｜>.", "Just text, <｜ not a call ｜>.", [], None),
    ("hermes", "a < b and <tool_c", "a < b and <tool_c", [], None),
]

# malformed markup: the whole text is content, streamed or not
MALFORMED = [
    ("deepseek_v3", "x" + DS_BEGIN + "garbage" + DS_END),
    ("deepseek_v3", "x" + DS_BEGIN + DS_CB + "function" + DS_SEP + "f\nno fence" + DS_CE + DS_END),
    ("deepseek_v31", DS_BEGIN + DS_CB + "no separator" + DS_CE + DS_END),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>no id<|tool_call_argument_begin|>{}<|tool_call_end|>"),
    ("glm45", "<tool_call>\n<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>"),  # no name
    ("hermes", "<tool_call>\n{not json}\n</tool_call>"),
    ("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {}}"),  # never closed
]


def accumulate(deltas: list[dict]) -> dict:
    """What the openai client builds from streamed deltas."""
    msg = {"content": None, "reasoning": None, "tool_calls": []}
    for d in deltas:
        assert set(d) <= {"content", "reasoning", "reasoning_content", "tool_calls"}, d
        assert d.get("reasoning") == d.get("reasoning_content")
        for key in ("content", "reasoning"):
            if key in d:
                assert d[key], "no empty delta is sent"
                msg[key] = (msg[key] or "") + d[key]
        for tc in d.get("tool_calls", []):
            if tc["index"] == len(msg["tool_calls"]):
                assert tc["type"] == "function" and tc["id"] and tc["function"]["name"]
                msg["tool_calls"].append({"id": tc["id"], "name": tc["function"]["name"],
                                          "arguments": tc["function"]["arguments"]})
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                msg["tool_calls"][tc["index"]]["arguments"] += tc["function"]["arguments"]
    return msg


def whole(out: ChoiceOutput, text: str) -> dict:
    m = out.message(text)
    return {"content": m["content"], "reasoning": m.get("reasoning"),
            "tool_calls": [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                           for c in m.get("tool_calls", [])]}


def streamed(make, text: str, cuts: list[int]) -> tuple[dict, bool]:
    out = make()
    ends = sorted(set(cuts) | {len(text)})
    deltas = [out.delta(text[a:e], e == len(text)) for a, e in zip([0] + ends, ends)]
    return accumulate([d for d in deltas if d]), out.tools_called


def check_streams(make, text: str) -> dict:
    want = whole(make(), text)
    ids = lambda m: [dict(c, id=None) for c in m["tool_calls"]]  # noqa: E731  server-made ids are random
    for cuts in [list(range(1, len(text)))] + [[b] for b in range(1, len(text))]:
        got, called = streamed(make, text, cuts)
        assert (got["content"], got["reasoning"]) == (want["content"] or None, want["reasoning"]), cuts
        assert ids(got) == ids(want), cuts
        assert called == bool(want["tool_calls"])
    return want


@pytest.mark.parametrize("parser,text,content,calls,kimi_ids", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_parse_whole_and_streamed_at_every_boundary(parser, text, content, calls, kimi_ids):
    make = lambda: ChoiceOutput(tools=TOOL_PARSERS[parser](TOOLS))  # noqa: E731
    want = check_streams(make, text)
    assert want["content"] == content
    assert [(c["name"], c["arguments"]) for c in want["tool_calls"]] == calls
    for c in want["tool_calls"]:
        json.loads(c["arguments"])
        assert c["id"].startswith("call_") if kimi_ids is None else True
    if kimi_ids is not None:
        assert [c["id"] for c in want["tool_calls"]] == kimi_ids
    for marker in TOOL_PARSERS[parser].tokens():
        assert marker not in (want["content"] or "")


@pytest.mark.parametrize("parser,text", MALFORMED, ids=[f"{c[0]}-{i}" for i, c in enumerate(MALFORMED)])
def test_malformed_markup_is_content(parser, text):
    make = lambda: ChoiceOutput(tools=TOOL_PARSERS[parser](TOOLS))  # noqa: E731
    want = check_streams(make, text)
    assert want["content"] == text and want["tool_calls"] == []


def test_a_good_call_then_a_malformed_one_keeps_the_good_one():
    text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>oops</tool_call>"
    want = check_streams(lambda: ChoiceOutput(tools=TOOL_PARSERS["hermes"]()), text)
    assert [(c["name"], c["arguments"]) for c in want["tool_calls"]] == [("f", '{"a": 1}')]
    assert want["content"] == "<tool_call>oops</tool_call>"


def test_glm_values_follow_the_schema():
    p = TOOL_PARSERS["glm45"](TOOLS)
    text = glm("get_weather", [("city", "123"), ("days", "[1, 2]")])
    [call] = p.parse(text, True).calls
    assert json.loads(call.arguments) == {"city": "123", "days": [1, 2]}  # city is a string in the schema


def test_streamed_call_arguments_grow_in_fragments():
    out = ChoiceOutput(tools=TOOL_PARSERS["deepseek_v31"]())
    text = DS_BEGIN + ds_v31("get_weather", A1) + DS_END
    deltas = [d for e in range(1, len(text) + 1) if (d := out.delta(text[e - 1:e], e == len(text)))]
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather" and "id" in calls[0]
    assert len(calls) > 3, "the arguments arrive as they are generated, not at the end"
    assert all("<｜" not in (tc["function"].get("arguments") or "") for tc in calls)


def test_parallel_tool_calls_false_keeps_the_first():
    text = DS_BEGIN + ds_v31("get_weather", A1) + ds_v31("get_time", A2) + DS_END
    want = check_streams(lambda: ChoiceOutput(tools=TOOL_PARSERS["deepseek_v31"](), parallel_tool_calls=False), text)
    assert [c["name"] for c in want["tool_calls"]] == ["get_weather"]


# ---- reasoning ------------------------------------------------------------------------------------

R1_OUT = "Okay, 2+2 is 4 — ✓.\n</think>\n\nThe answer is 4."


@pytest.mark.parametrize("name,prompt,kwargs,text,thinking,content", [
    ("deepseek_r1", "<｜User｜>2+2?<｜Assistant｜><think>\n", {}, R1_OUT, "Okay, 2+2 is 4 — ✓.\n", "\n\nThe answer is 4."),
    ("deepseek_r1", "<｜User｜>2+2?<｜Assistant｜>", {}, "<think>" + R1_OUT, "Okay, 2+2 is 4 — ✓.\n", "\n\nThe answer is 4."),
    ("deepseek_r1", "p", {}, "still thinking when cut off", "still thinking when cut off", None),
    ("deepseek_v3", "<｜Assistant｜><think>", {"thinking": True}, R1_OUT, "Okay, 2+2 is 4 — ✓.\n", "\n\nThe answer is 4."),
    ("qwen3", "<|im_start|>assistant\n", {}, "<think>\nhmm\n</think>\n\nHi!", "\nhmm\n", "\n\nHi!"),
    ("qwen3", "<|im_start|>assistant\n", {}, "Hi, no thinking <think> here", None, "Hi, no thinking <think> here"),
    ("glm45", "<|assistant|><think>", {}, "plan</think>answer", "plan", "answer"),
    ("kimi_k2", "<|im_assistant|>assistant<|im_middle|>", {}, "<think>t</think>a", "t", "a"),
])
def test_reasoning_whole_and_streamed(name, prompt, kwargs, text, thinking, content):
    make = lambda: ChoiceOutput(reasoning=reasoning_splitter(name, prompt, kwargs))  # noqa: E731
    want = check_streams(make, text)
    assert (want["reasoning"], want["content"]) == (thinking, content)


def test_thinking_off_means_no_reasoning_field_split():
    assert reasoning_splitter("deepseek_v3", "<｜Assistant｜></think>", {"thinking": False}) is None
    assert reasoning_splitter("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", {}) is None
    assert reasoning_splitter(None, "x", {}) is None


def test_reasoning_then_tool_calls():
    text = "I need the weather.</think>Let me check." + DS_BEGIN + ds_v3("get_weather", A1) + DS_END
    make = lambda: ChoiceOutput(reasoning=ThinkSplitter(opens=True), tools=TOOL_PARSERS["deepseek_v3"](TOOLS))  # noqa: E731
    want = check_streams(make, text)
    assert want["reasoning"] == "I need the weather."
    assert want["content"] == "Let me check."
    assert [(c["name"], c["arguments"]) for c in want["tool_calls"]] == [("get_weather", A1)]
