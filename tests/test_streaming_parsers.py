"""The chat parsers read a stream as it grows (issue 38 step 5: no per-token work that grows with
the output): each streamed step feeds only its new text to the reasoning split and the tool-call
reading. Checked here, with no model:

- equivalence: for every tool-call parser, with and without a reasoning parser, and for the
  forced tool_choice readers, random real-looking outputs (thinking, content, several calls,
  multibyte characters, text that looks like the start of a marker) cut into random pieces give,
  step by step, the deltas that the whole-text parses of the text so far gave
  (tests/whole_text_parsers.py keeps those as the reference), their sum is the non-streamed
  message, and that message is the whole-text parse's;
- cost: a step reads only what is still open. The format's call readers see each complete call
  once (the whole-text parse read every complete call again at every step), and no tail check
  is handed more than the new piece and a marker's length (it was handed all the text so far,
  sliced out of the whole text at every step).
"""

from __future__ import annotations

import json

import pytest

import whole_text_parsers as ref
from mla_export.server.chat_output import ChoiceOutput
from mla_export.server.forced_tools import NamedCall, RequiredCalls
from mla_export.server.reasoning_parsers import ThinkSplitter
from mla_export.server.tool_parsers import TOOL_PARSERS
from test_tool_parsers import DS_BEGIN, DS_END, TOOLS, ds_v3, ds_v31, glm, hermes, kimi

KIMI_BEGIN, KIMI_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
WORDS = ["Paris", "Zürich 🏔", "東京 🗼", 'a "quoted" <b>', "x < y", "über", "emoji 😀 ok", "<tool", "<｜tool", "</th"]


def _args(rng) -> dict:
    args = {"city": str(rng.choice(WORDS))}
    if rng.random() < 0.5:
        args["days"] = int(rng.integers(0, 30))
    return args


def _call(parser: str, rng, i: int) -> str:
    name = str(rng.choice(["get_weather", "get_time"]))
    args = _args(rng)
    text = json.dumps(args, ensure_ascii=False)
    if parser == "deepseek_v3":
        return ds_v3(name, text)
    if parser == "deepseek_v31":
        return ds_v31(name, text)
    if parser == "kimi_k2":
        return kimi(name, i, text)
    if parser == "glm45":
        return glm(name, [(k, str(v)) for k, v in args.items()], sep=str(rng.choice(["\n", ""])))
    return hermes(name, args)


def _text(rng, n: int) -> str:
    return " ".join(str(rng.choice(WORDS)) for _ in range(n))


def output(parser: str, reasoning: str | None, rng) -> str:
    """A real-looking output: thinking (as the reasoning parser's template makes it), content,
    several calls with whitespace between them, maybe text after; sometimes cut short."""
    out = ""
    if reasoning is not None:
        if reasoning == "tag" or rng.random() < 0.2:
            out += "<think>"
        out += _text(rng, int(rng.integers(0, 6)))
        if rng.random() < 0.9:
            out += "</think>"
    out += _text(rng, int(rng.integers(0, 5)))
    n = int(rng.integers(0, 4))
    if n:
        seps = ["", "\n", " \n"]
        section = {"deepseek_v3": (DS_BEGIN, DS_END), "deepseek_v31": (DS_BEGIN, DS_END),
                   "kimi_k2": (KIMI_BEGIN, KIMI_END)}.get(parser)
        calls = str(rng.choice(seps)).join(_call(parser, rng, i) for i in range(n))
        if section:
            calls = section[0] + calls + (section[1] if rng.random() < 0.85 else "")
        out += calls
        out += str(rng.choice(["", "", "\n", "  ", "\nDone ✓.", " more <tool"]))
    if rng.random() < 0.15:
        out = out[:int(rng.integers(0, len(out) + 1))]  # cut by max_tokens
    return out


def cuts(rng, text: str) -> list[list[int]]:
    """Ends of the pieces a stream is cut into: one character at a time, and random lengths."""
    every = list(range(1, len(text) + 1)) or [0]
    out = [every]
    for _ in range(6):
        ends, e = [], 0
        while e < len(text):
            e = min(len(text), e + int(rng.integers(1, 14)))
            ends.append(e)
        out.append(ends or [0])
    return out


def stream(out: ChoiceOutput, text: str, ends: list[int]) -> list[dict]:
    """The deltas a stream sends for these pieces, the server's random call ids left out."""
    deltas = []
    for a, e in zip([0] + ends, ends):
        d = out.delta(text[a:e], e == len(text))
        for tc in d.get("tool_calls", []):
            if "id" in tc and tc["id"].startswith("call_"):
                tc["id"] = True
        deltas.append(d)
    return deltas


def added_up(deltas: list[dict]) -> dict:
    msg = {"content": None, "reasoning": None, "tool_calls": []}
    for d in deltas:
        for key in ("content", "reasoning"):
            if key in d:
                msg[key] = (msg[key] or "") + d[key]
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                msg["tool_calls"].append([tc["function"]["name"], tc["function"]["arguments"], tc["id"]])
            else:
                msg["tool_calls"][tc["index"]][1] += tc["function"]["arguments"]
    return msg


def message(out: ChoiceOutput, text: str) -> dict:
    m = out.message(text)
    return {"content": m["content"], "reasoning": m.get("reasoning"),
            "tool_calls": [(c["function"]["name"], c["function"]["arguments"],
                            c["id"] if not c["id"].startswith("call_") else None) for c in m.get("tool_calls", [])]}


# no reasoning parser; R1's (the prompt opened the thinking); Qwen's (the output opens it)
REASONING = {None: None, "opens": True, "tag": False}


class TestTheStreamIsTheWholeTextParse:
    """Cause: the incremental reading must say what the whole-text parse said, at every step."""

    @pytest.mark.parametrize("reasoning", list(REASONING))
    @pytest.mark.parametrize("parser", sorted(TOOL_PARSERS))
    def test_random_outputs_in_random_pieces(self, parser, reasoning, rng):
        cls = TOOL_PARSERS[parser]
        opens = REASONING[reasoning]
        for _ in range(25):
            text = output(parser, reasoning, rng)
            parallel = bool(rng.random() < 0.8)

            def make():
                return ChoiceOutput(reasoning=ThinkSplitter(opens) if opens is not None else None, tools=cls(TOOLS),
                                    parallel_tool_calls=parallel)

            want = ref.reference_message(opens, cls(TOOLS), text, parallel)
            got = message(make(), text)
            assert got["content"] == want["content"] and got["reasoning"] == want["reasoning"], text
            assert [c[:2] for c in got["tool_calls"]] == [c[:2] for c in want["tool_calls"]], text
            assert [c[2] for c in got["tool_calls"]] == [c[2] for c in want["tool_calls"]], text
            for ends in cuts(rng, text):
                deltas = stream(make(), text, ends)
                assert deltas == ref.reference_deltas(opens, lambda t, f: ref.parse(cls(TOOLS), t, f), text, ends,
                                                      parallel), (text, ends)
                summed = added_up(deltas)
                assert summed["content"] == (got["content"] or None) and summed["reasoning"] == got["reasoning"]
                n = len(got["tool_calls"])
                assert [tuple(c[:2]) for c in summed["tool_calls"][:n]] == [c[:2] for c in got["tool_calls"]]
                # a stream cannot take back a call it started that the cut then broke
                assert len(summed["tool_calls"]) in (n, n + 1)

    @pytest.mark.parametrize("reasoning", ["opens", "tag"])
    def test_reasoning_alone(self, reasoning, rng):
        opens = REASONING[reasoning]
        for _ in range(40):
            text = output("hermes", reasoning, rng)
            make = lambda: ChoiceOutput(reasoning=ThinkSplitter(opens))  # noqa: E731
            want = ref.reference_message(opens, None, text)
            assert message(make(), text) == want, text
            for ends in cuts(rng, text):
                deltas = stream(make(), text, ends)
                assert deltas == ref.reference_deltas(opens, None, text, ends), (text, ends)
                assert added_up(deltas)["content"] == want["content"]
                assert added_up(deltas)["reasoning"] == want["reasoning"]


def _forced_output(rng, parallel: bool) -> str:
    items = []
    for _ in range(int(rng.integers(1, 4 if parallel else 2))):
        item = {"name": str(rng.choice(["get_weather", "get_time"])), "parameters": _args(rng)}
        if rng.random() < 0.3:
            item = {"parameters": item["parameters"], "name": item["name"]}  # any key order
        items.append(json.dumps(item, ensure_ascii=False, separators=(str(rng.choice([",", ", "])), ": ")))
    text = "[" + str(rng.choice(["", "\n", " "])).join(f"{x}," for x in items)[:-1] + "]"
    if rng.random() < 0.2:
        text = text[:int(rng.integers(0, len(text) + 1))]
    return text


class TestForcedCallsStreamAsTheyParse:
    """Cause: tool_choice "required" / named re-read the whole output each step; its stream must
    still be the difference of the whole-text readings."""

    @pytest.mark.parametrize("parallel", [True, False])
    def test_required(self, parallel, rng):
        for _ in range(30):
            text = _forced_output(rng, parallel)
            for ends in cuts(rng, text):
                out = ChoiceOutput(tools=RequiredCalls(), parallel_tool_calls=parallel, forced="required")
                deltas = stream(out, text, ends)
                assert deltas == ref.reference_deltas(None, RequiredCalls().parse, text, ends, parallel, forced=True)
                final = RequiredCalls().parse(text, True).calls
                assert out.tools_called == bool(final)
                if final:
                    summed = added_up(deltas)
                    assert [tuple(c[:2]) for c in summed["tool_calls"]] == [(c.name, c.arguments) for c in final][
                        :None if parallel else 1]

    def test_named(self, rng):
        for _ in range(10):
            text = json.dumps(_args(rng), ensure_ascii=False)
            for ends in cuts(rng, text):
                out = ChoiceOutput(tools=NamedCall("get_weather"), forced="named")
                deltas = stream(out, text, ends)
                assert deltas == ref.reference_deltas(None, NamedCall("get_weather").parse, text, ends, forced=True)
                assert not out.tools_called


# ---- cost ------------------------------------------------------------------------------------------

def _served(out: ChoiceOutput, pieces: list[str]) -> None:
    """The pieces through the server's own streamed chunk builder (generation.chat_delta)."""
    from mla_export.server import protocol as P
    from mla_export.server.generation import _Choice, chat_delta

    s = P.parse_chat_request({"messages": [{"role": "user", "content": "x"}], "stream": True}).sampling
    ch = _Choice(index=0, request_id="r", stop=[])
    ch.out = out
    for k, piece in enumerate(pieces):
        ch.add_text(piece)
        ch.finished = k == len(pieces) - 1
        chat_delta(ch, piece, [k], None, s)


class TestAStepReadsOnlyWhatIsOpen:
    """Cause: every step re-parsed the whole text so far (the think split and each tool-call
    parse ran over all of it), so a reply of n tokens cost O(n^2)."""

    def _pieces(self, text: str) -> list[str]:
        return [text[i:i + 3] for i in range(0, len(text), 3)]

    def test_each_complete_call_is_read_once(self, monkeypatch):
        cls = TOOL_PARSERS["deepseek_v31"]
        read = []
        real = cls.read_call
        monkeypatch.setattr(cls, "read_call", lambda self, body, i: (read.append(i), real(self, body, i))[1])
        calls = "".join(ds_v31("get_weather", json.dumps({"city": c}, ensure_ascii=False)) for c in WORDS)
        text = "Checking. " + DS_BEGIN + calls + DS_END
        _served(ChoiceOutput(reasoning=ThinkSplitter(True), tools=cls(TOOLS)), self._pieces("ok</think>" + text))
        assert read == list(range(len(WORDS)))

    @pytest.mark.parametrize("parser", sorted(TOOL_PARSERS))
    def test_tail_checks_look_at_the_new_piece_only(self, parser, monkeypatch):
        """A long thinking and a long answer: the longest text any hold-back check is handed stays
        near a piece plus a marker (it was all the thinking, then all the content so far)."""
        import mla_export.server.reasoning_parsers as rp
        import mla_export.server.tool_parsers.base as base

        seen = []
        real = base.held_back

        def held_back(text, *markers):
            seen.append(len(text))
            return real(text, *markers)

        monkeypatch.setattr(rp, "held_back", held_back)
        monkeypatch.setattr(base, "held_back", held_back)
        long = " ".join(WORDS) * 40  # ~3,600 characters
        cls = TOOL_PARSERS[parser]
        text = long + "</think>" + long
        _served(ChoiceOutput(reasoning=ThinkSplitter(True), tools=cls(TOOLS)), self._pieces(text))
        assert seen and max(seen) <= 3 + max(len(m) for m in (*cls.tokens(), "</think>")), max(seen)
