"""Kimi K2 (vLLM `kimi_k2`): each call headed by its id `functions.NAME:IDX`, which is also the
tool call's id in the response (as vLLM and Moonshot's API return it):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
"""

from __future__ import annotations

import re

from .base import Call, Malformed, ToolParser

ARG = "<|tool_call_argument_begin|>"
_ID = re.compile(r"\s*(?P<id>[^\s<>]+?:\d+)\s*")


def _name_of(call_id: str) -> str:
    name = call_id.rsplit(":", 1)[0]
    return name[len("functions."):] if name.startswith("functions.") else name


class KimiK2ToolParser(ToolParser):
    name = "kimi_k2"
    section = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
    call = ("<|tool_call_begin|>", "<|tool_call_end|>")
    extra_tokens = (ARG,)

    def _head(self, body: str):
        head, sep, args = body.partition(ARG)
        m = _ID.fullmatch(head) if sep else None
        if m is None or not _name_of(m["id"]):
            return None
        return m["id"], args

    def read_call(self, body: str, index: int) -> Call:
        got = self._head(body)
        if got is None:
            raise Malformed(f"not a Kimi K2 tool call: {body[:60]!r}")
        call_id, args = got
        return Call(_name_of(call_id), args.strip(), id=call_id)

    def read_partial(self, body: str, index: int) -> Call | None:
        got = self._head(body)
        if got is None:
            return None
        call_id, args = got
        return Call(_name_of(call_id), args.lstrip().rstrip(), id=call_id)
