"""tool_choice "required" and a named function, as vLLM serves them: the output is forced by a
JSON-schema constraint (structured outputs) and read back as tool calls; no tool-call parser
(nor --enable-auto-tool-choice) is involved.

- named function: the constraint is the function's `parameters` schema (an empty object schema
  when it has none), and the whole output is that call's `arguments`;
- "required": the constraint is vLLM's array schema, at least one item (at most one with
  `parallel_tool_calls: false`), each item `{"name": one tool's name, "parameters": that tool's
  schema}` and no other key (`anyOf` over the tools, the tools' `$defs` lifted to the top so their `$ref`s
  resolve); each item is a call whose `arguments` are the text generated for its `parameters`.

`forced_schema` builds the schema; tool_request.py turns it into the request's
StructuredOutputsParams with structured_request.tool_choice_constraint (the request's own
structured-output options such as disable_any_whitespace join it; a constraint of its own is a
400 naming its field). `NamedCall` and `RequiredCalls` read the output with the
ToolParser interface (`parse(text, final) -> Parsed` for a whole output, `stream()` for one
growing a piece at a time), so chat_output.ChoiceOutput streams them like parsed calls: a call
first shows with its id and name, then argument fragments; the streamed fragments add up to
the non-streamed arguments. A stream's step reads only the new text (a named call) or the item
still open (an array of calls), never the whole output again.
"""

from __future__ import annotations

import copy
import json

from .tool_parsers import Call, CallDelta, CallTracker, Parsed

__all__ = ["forced_schema", "NamedCall", "RequiredCalls", "EMPTY_PARAMETERS"]

# A function without parameters takes an empty object. vLLM's schemas here say no
# additionalProperties and get closed objects from its default backend (xgrammar's strict mode);
# llguidance follows JSON Schema (open objects, a model may add keys without end), so the objects
# this module makes (this one, the "required" items) are closed explicitly. A tool's own
# parameters schema is used as given.
EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def _params(tool: dict) -> dict:
    return copy.deepcopy(tool["function"].get("parameters") or EMPTY_PARAMETERS)


def forced_schema(tools: list[dict], choice, parallel: bool) -> tuple[dict, str]:
    """(the JSON schema forcing this tool_choice, the request field a bad schema comes from).
    ValueError (naming the tools) when the tools' `$defs` disagree."""
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        i = next(i for i, t in enumerate(tools) if t["function"]["name"] == name)
        return _params(tools[i]), f"tools.[{i}].function.parameters"
    items, defs = [], {}
    for i, t in enumerate(tools):
        params = _params(t)
        for k, v in (params.pop("$defs", None) or {}).items():
            if k in defs and defs[k] != v:
                raise ValueError(f"tools: '$defs.{k}' is defined differently by two tools; with tool_choice "
                                 "\"required\" their definitions share one namespace")
            defs[k] = v
        items.append({"properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                     "parameters": params},
                      "required": ["name", "parameters"], "additionalProperties": False})
    schema: dict = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema, "tools"


class NamedCall:
    """The named function's one call: all of the output is its arguments."""

    def __init__(self, name: str):
        self.name = name

    def parse(self, text: str, final: bool) -> Parsed:
        return Parsed("", [Call(self.name, text, done=final)])

    def stream(self) -> "_NamedStream":
        return _NamedStream(self.name)


class _NamedStream:
    def __init__(self, name: str):
        self.name = name
        self.started = False

    def feed(self, piece: str, final: bool) -> tuple[str, list[CallDelta]]:
        """(content: none, the call's delta): its first one names it, then each piece is an
        argument fragment."""
        if self.started:
            return "", [CallDelta(0, piece)] if piece else []
        self.started = True
        return "", [CallDelta(0, piece, self.name)]


# ---- a JSON array of calls, read as it grows ------------------------------------------------

_WS = " \t\n\r"


class _Incomplete(Exception):
    """The text ends inside this value."""


class _Bad(ValueError):
    """Not the array of calls the constraint describes."""


def _skip_ws(t: str, i: int) -> int:
    while i < len(t) and t[i] in _WS:
        i += 1
    return i


def _string_end(t: str, i: int) -> int:
    j = i + 1
    while j < len(t):
        if t[j] == "\\":
            j += 2
        elif t[j] == '"':
            return j + 1
        else:
            j += 1
    raise _Incomplete


def _value_end(t: str, i: int, final: bool) -> int:
    """The end of the JSON value starting at i (its syntax inside is not checked here)."""
    if i >= len(t):
        raise _Incomplete
    if t[i] == '"':
        return _string_end(t, i)
    if t[i] in "{[":
        depth, j = 0, i
        while j < len(t):
            c = t[j]
            if c == '"':
                j = _string_end(t, j)
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        raise _Incomplete
    j = i  # a number or true / false / null: it may still grow while the text does
    while j < len(t) and t[j] not in _WS + ",]}":
        j += 1
    if j == i:
        raise _Bad("a value was expected")
    if j == len(t) and not final:
        raise _Incomplete
    return j


def _element(t: str, i: int, final: bool) -> tuple[str | None, str | None, int | None]:
    """One item object from after its `{`: (name, parameters text so far, end) with end None
    while the item is incomplete."""
    name = args = None
    while True:
        i = _skip_ws(t, i)
        if i >= len(t):
            return name, args, None
        if t[i] == "}":
            return name, args, i + 1
        if t[i] == ",":
            i += 1
            continue
        if t[i] != '"':
            raise _Bad("a key was expected")
        try:
            key_end = _string_end(t, i)
        except _Incomplete:
            return name, args, None
        key = json.loads(t[i:key_end])
        i = _skip_ws(t, key_end)
        if i >= len(t):
            return name, args, None
        if t[i] != ":":
            raise _Bad("':' was expected")
        i = _skip_ws(t, i + 1)
        if i >= len(t):
            return name, args, None
        try:
            end = _value_end(t, i, final)
        except _Incomplete:
            if key == "parameters":
                args = t[i:]
            return name, args, None
        if key == "name":
            name = json.loads(t[i:end])
            if not isinstance(name, str):
                raise _Bad("'name' must be a string")
        elif key == "parameters":
            args = t[i:end]
        i = end


class RequiredCalls:
    """The calls of tool_choice "required": `[{"name": ..., "parameters": {...}}, ...]`. A call
    shows once its name is complete; its arguments are the text of its `parameters` value as
    generated (vLLM streams that text; its non-streamed answer re-serializes it, the same JSON)."""

    def parse(self, text: str, final: bool) -> Parsed:
        if final:  # the whole output must be the array: else it is returned as text (e.g. cut by max_tokens)
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                return Parsed(text, [])
            if not (isinstance(value, list) and value and all(
                    isinstance(v, dict) and isinstance(v.get("name"), str) and "parameters" in v for v in value)):
                return Parsed(text, [])
        try:
            return Parsed("", self._scan(text, final))
        except _Bad:
            return Parsed(text if final else "", [])

    def stream(self) -> "_ArrayStream":
        return _ArrayStream()

    @staticmethod
    def _scan(t: str, final: bool) -> list[Call]:
        return _scan_from(t, final, False, 0)[0]


def _scan_from(t: str, final: bool, opened: bool, before: int) -> tuple[list[Call], int, bool, bool]:
    """The calls read from `t`, a part of the output that starts where an item may start
    (`opened`: after the array's `[`; `before`: items read earlier). Returns (calls, where the
    text is settled: after the `[`, the last complete item and the whitespace after it; whether
    the `[` was read; whether the `]` was)."""
    calls: list[Call] = []
    i = _skip_ws(t, 0)
    if not opened:
        if i >= len(t):
            return calls, i, False, False
        if t[i] != "[":
            raise _Bad("'[' was expected")
        i += 1
    while True:
        i = _skip_ws(t, i)
        settled = i
        if i >= len(t) or t[i] == "]":
            return calls, settled, True, i < len(t)
        if t[i] == "," and (calls or before):
            i += 1
            continue
        if t[i] != "{":
            raise _Bad("'{' was expected")
        name, args, end = _element(t, i + 1, final)
        if name is None:
            if end is not None:
                raise _Bad("an item without 'name'")
            return calls, settled, True, False
        calls.append(Call(name, args or "", done=end is not None))
        if end is None:
            return calls, settled, True, False
        i = end


class _ArrayStream:
    """RequiredCalls read as the output grows: only the text from the item still open is
    kept and read again at each step."""

    def __init__(self):
        self.tracker = CallTracker()
        self._open = ""  # the output from where it is not settled
        self._opened = False  # the `[` was read
        self._done = 0  # complete items read
        self._over = False  # the `]` came, or the text cannot be the array: nothing more is read

    def feed(self, piece: str, final: bool) -> tuple[str, list[CallDelta]]:
        """(content: none while the output grows, call deltas). `final` is not used: a
        stream reads the growing text and the finished output is read whole (parse)."""
        deltas: list[CallDelta] = []
        if self._over:
            return "", deltas
        t = self._open + piece
        try:
            calls, settled, self._opened, closed = _scan_from(t, False, self._opened, self._done)
        except _Bad:  # not the array (it stays so as the text grows): the calls sent stay
            self._over = True
            return "", deltas
        for k, c in enumerate(calls):
            self.tracker.update(self._done + k, c, deltas)
        self._done += sum(c.done for c in calls)
        self._open = t[settled:]  # the complete items are read for good: the open one is read again
        self._over = closed
        return "", deltas
