"""Hermes / Qwen (vLLM `hermes`): a JSON object per call, each in its own tags:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The object is read whole, so a streamed call arrives in one delta (name and arguments) once
its closing tag came.
"""

from __future__ import annotations

import json

from .base import Call, Malformed, ToolParser


class HermesToolParser(ToolParser):
    name = "hermes"
    call = ("<tool_call>", "</tool_call>")

    def read_call(self, body: str, index: int) -> Call:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            raise Malformed(f"a <tool_call> that is not JSON: {body[:60]!r}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            raise Malformed("a <tool_call> object without a name")
        args = obj.get("arguments", {})
        if not isinstance(args, dict):
            raise Malformed("a <tool_call> whose arguments are not an object")
        return Call(obj["name"], json.dumps(args, ensure_ascii=False))
