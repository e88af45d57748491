"""GLM-4.5 / 4.6 / 4.7 (vLLM `glm45`; 4.7 writes the first key right after the name): the name,
then key/value pairs; a value is text when the tool's schema declares that argument a string,
else JSON (text when it does not parse). The arguments are returned as one JSON object.

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>
"""

from __future__ import annotations

import json
import re

from .base import Call, Malformed, ToolParser

_PAIR = re.compile(r"\s*<arg_key>(?P<k>.*?)</arg_key>\s*<arg_value>(?P<v>.*?)</arg_value>", re.DOTALL)


class Glm45ToolParser(ToolParser):
    name = "glm45"
    call = ("<tool_call>", "</tool_call>")
    extra_tokens = ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")

    def _is_string(self, name: str, key: str) -> bool:
        for t in self.tools:
            f = t.get("function") or {}
            if f.get("name") == name:
                props = (f.get("parameters") or {}).get("properties") or {}
                return isinstance(props.get(key), dict) and props[key].get("type") == "string"
        return False

    def _value(self, name: str, key: str, raw: str):
        if self._is_string(name, key):
            return raw
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            return raw

    def _read(self, body: str, complete: bool):
        """(name, [pair texts], end of the last pair) or None when the name is not known yet."""
        cut = [i for i in (body.find("\n"), body.find("<arg_key>")) if i >= 0]
        if not cut:
            if not complete:
                return None
            cut = [len(body)]
        name = body[:min(cut)].strip()
        if not name or "<" in name:
            if complete:
                raise Malformed(f"a GLM tool call without a name: {body[:60]!r}")
            return None
        pos, items = min(cut), []
        while (m := _PAIR.match(body, pos)) is not None:
            key = m["k"].strip()
            items.append(f"{json.dumps(key, ensure_ascii=False)}: "
                         f"{json.dumps(self._value(name, key, m['v']), ensure_ascii=False)}")
            pos = m.end()
        if complete and body[pos:].strip():
            raise Malformed(f"unexpected text in a GLM tool call: {body[pos:pos + 40]!r}")
        return name, items

    def read_call(self, body: str, index: int) -> Call:
        name, items = self._read(body, True)
        return Call(name, "{" + ", ".join(items) + "}")

    def read_partial(self, body: str, index: int) -> Call | None:
        got = self._read(body, False)
        if got is None:
            return None
        name, items = got
        return Call(name, "{" + ", ".join(items))
