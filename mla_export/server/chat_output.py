"""A chat choice's text as vLLM's chat API returns it with a reasoning parser and/or a tool-call
parser: `reasoning` (and its older name `reasoning_content`), `content` and `tool_calls`.

    out = ChoiceOutput(reasoning=splitter, tools=parser, parallel_tool_calls=True)
    out.delta(new_text, finished)  -> the next streamed delta's fields ({} when nothing new)
    out.message(text)              -> the non-streamed message
    out.tools_called               -> finish_reason "tool_calls"

A stream is read as it grows: each step feeds only its new text to the choice's reasoning split
and tool-call reading (reasoning_parsers.ThinkStream, tool_parsers/base.ToolStream), which keep
what is not settled yet, so a step's work does not grow with the output. The non-streamed
message is the same reading fed the whole text at once, so the deltas of a stream add up to it.
A tool call first shows with its id, type and name (and the arguments known then), later deltas
carry argument fragments, as OpenAI streams them. With `forced` ("required" or "named":
tool_choice forced by a constraint, forced_tools.py) content beside the calls is "" and only
"required" calls finish with "tool_calls", as vLLM answers.
"""

from __future__ import annotations

import uuid

from .reasoning_parsers import ThinkSplitter
from .tool_parsers import Call, ToolParser, calls_of

__all__ = ["ChoiceOutput", "new_call_id"]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChoiceOutput:
    def __init__(self, *, reasoning: ThinkSplitter | None = None, tools: ToolParser | None = None,
                 parallel_tool_calls: bool = True, forced: str | None = None):
        self.reasoning = reasoning
        self.tools = tools
        self.parallel = parallel_tool_calls
        # tool_choice "required" / "named" (forced_tools.py): content "" beside the calls, and a
        # named call keeps the engine's finish_reason (vLLM's, after OpenAI's: "stop", not "tool_calls")
        self.forced = forced
        self._think = reasoning.stream() if reasoning is not None else None
        self._calls = tools.stream() if tools is not None else None
        self._ids: list[str] = []  # the ids of the calls sent
        # "required": whether the calls stand is decided by reading the finished output whole
        self._pieces: list[str] | None = [] if forced == "required" else None
        self.tools_called = False

    def delta(self, new_text: str, final: bool) -> dict:
        """The fields a stream's next delta carries for `new_text`, the text the output grew by
        (`final`: it ends with it)."""
        d: dict = {}
        thinking, answer = self._think.feed(new_text, final) if self._think is not None else ("", new_text)
        if thinking:
            d["reasoning"] = d["reasoning_content"] = thinking
        tool_deltas = []
        if answer is not None and self._calls is not None:
            # A forced stream sends what the growing reading reads; at the end the finished
            # reading only decides finish_reason (an output cut before its JSON completed keeps
            # the calls already sent, with finish_reason "length"; the non-streamed answer is
            # then its text).
            answer, calls = self._calls.feed(answer, final and self.forced is None)
            for c in calls:
                if c.index > 0 and not self.parallel:
                    continue
                if c.index == len(self._ids):
                    self._ids.append(c.id or new_call_id())
                    tool_deltas.append({"index": c.index, "id": self._ids[-1], "type": "function",
                                        "function": {"name": c.name, "arguments": c.arguments}})
                elif c.arguments:
                    tool_deltas.append({"index": c.index, "function": {"arguments": c.arguments}})
        if answer:
            d["content"] = answer
        if tool_deltas:
            d["tool_calls"] = tool_deltas
        if self.forced is None:
            self.tools_called = bool(self._ids)
        else:
            if self._pieces is not None:
                self._pieces.append(new_text)
            if final:  # forced "required": calls only parse from a complete array, i.e. the grammar finished
                self.tools_called = (self.forced == "required"
                                     and bool(self.tools.parse("".join(self._pieces), True).calls))
        return d

    def _read(self, text: str) -> tuple[str | None, str | None, list[Call]]:
        """(thinking, answer, calls) of a finished output."""
        if self.forced is not None:
            parsed = self.tools.parse(text, True)
            return None, parsed.content, parsed.calls
        thinking, answer = self.reasoning.split(text) if self.reasoning is not None else (None, text)
        calls: list[Call] = []
        if answer is not None and self.tools is not None:
            answer, deltas = self.tools.stream().feed(answer, True)
            calls = calls_of(deltas)
        return thinking, answer, calls

    def message(self, text: str) -> dict:
        thinking, answer, calls = self._read(text)
        if not self.parallel:
            calls = calls[:1]
        self.tools_called = bool(calls) and self.forced != "named"
        msg: dict = {"role": "assistant"}
        if self.forced is not None and calls:
            answer = answer or ""  # vLLM's empty content beside forced calls
        elif self.reasoning is not None or calls:
            answer = answer or None  # OpenAI's null content beside tool calls / after thinking only
        msg["content"] = answer
        if self.reasoning is not None:
            msg["reasoning"] = msg["reasoning_content"] = thinking or None
        if calls:
            msg["tool_calls"] = [{"id": c.id or new_call_id(), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return msg
