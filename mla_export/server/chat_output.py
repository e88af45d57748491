"""A chat choice's text as vLLM's chat API returns it with a reasoning parser and/or a tool-call
parser: `reasoning` (and its older name `reasoning_content`), `content` and `tool_calls`.

    out = ChoiceOutput(reasoning=splitter, tools=parser, parallel_tool_calls=True)
    out.delta(text_so_far, finished)  -> the next streamed delta's fields ({} when nothing new)
    out.message(text)                 -> the non-streamed message
    out.tools_called                  -> finish_reason "tool_calls"

Streamed deltas are differences of consecutive parses of the whole text so far (see
tool_parsers/base.py), so the deltas of a stream add up to the non-streamed message. A tool
call first shows with its id, type and name (and the arguments known then), later deltas carry
argument fragments, as OpenAI streams them. With `forced` ("required" or "named": tool_choice
forced by a constraint, forced_tools.py) content beside the calls is "" and only "required"
calls finish with "tool_calls", as vLLM answers.
"""

from __future__ import annotations

import uuid

from .reasoning_parsers import ThinkSplitter
from .tool_parsers import Call, ToolParser

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
        self._sent_reasoning = 0
        self._sent_content = 0
        self._sent_calls: list[list] = []  # [id, length of the arguments sent]
        self.tools_called = False

    def _split(self, text: str, final: bool) -> tuple[str | None, str | None, list[Call]]:
        thinking, answer = self.reasoning.split(text, final) if self.reasoning else (None, text)
        calls: list[Call] = []
        if answer is not None and self.tools is not None:
            parsed = self.tools.parse(answer, final)
            answer, calls = parsed.content, parsed.calls
            if not self.parallel:
                calls = calls[:1]
        if final:  # forced "required": calls only parse from a complete array, i.e. the grammar finished
            self.tools_called = bool(calls) and self.forced != "named"
        return thinking, answer, calls

    def delta(self, text: str, final: bool) -> dict:
        if self.forced is not None:
            # A forced stream sends what the growing parse reads; at the end the finished parse
            # only decides finish_reason (an output cut before its JSON completed keeps the calls
            # already sent, with finish_reason "length"; the non-streamed answer is then its text).
            thinking, answer, calls = self._split(text, False)
            if final:
                self._split(text, True)
        else:
            thinking, answer, calls = self._split(text, final)
        d: dict = {}
        if thinking is not None and len(thinking) > self._sent_reasoning:
            d["reasoning"] = d["reasoning_content"] = thinking[self._sent_reasoning:]
            self._sent_reasoning = len(thinking)
        if answer is not None and len(answer) > self._sent_content:
            d["content"] = answer[self._sent_content:]
            self._sent_content = len(answer)
        tool_deltas = []
        for i, c in enumerate(calls):
            if i == len(self._sent_calls):
                cid = c.id or new_call_id()
                self._sent_calls.append([cid, len(c.arguments)])
                tool_deltas.append({"index": i, "id": cid, "type": "function",
                                    "function": {"name": c.name, "arguments": c.arguments}})
            elif len(c.arguments) > self._sent_calls[i][1]:
                tool_deltas.append({"index": i, "function": {"arguments": c.arguments[self._sent_calls[i][1]:]}})
                self._sent_calls[i][1] = len(c.arguments)
        if tool_deltas:
            d["tool_calls"] = tool_deltas
        if self._sent_calls and self.forced is None:
            self.tools_called = True
        return d

    def message(self, text: str) -> dict:
        thinking, answer, calls = self._split(text, True)
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
