"""The chat request's tool fields, read as OpenAI (and vLLM) define them:

    tools: [{"type": "function", "function": {"name", "description"?, "parameters"?: JSON schema object, "strict"?}}]
    tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
                 (default "auto" with tools, "none" without, as vLLM)
    parallel_tool_calls: bool (default true; false keeps the first call)
    ("required" and a named function are forced by a JSON-schema constraint: forced_tools.py)
    messages: assistant `tool_calls` [{"id", "type": "function", "function": {"name", "arguments": JSON text}}],
              role "tool" with `tool_call_id`

For the chat template an assistant message's call arguments become a mapping (as vLLM hands
them to templates: Qwen's and GLM's iterate or `tojson` them) that prints, and concatenates, as
its JSON text (DeepSeek's and Kimi's official templates write the arguments as text).
Every shape error is a 400 naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["ToolRequest", "parse_tool_fields", "message_tool_fields", "JSONArgs"]

TOOL_CHOICES = ("none", "auto", "required")


def _bad(message: str, param: str):
    from .api_error import bad_request

    return bad_request(message, param)


class JSONArgs(dict):
    """Call arguments for a chat template: a mapping whose text is its JSON."""

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)

    def __add__(self, other):
        if isinstance(other, str):
            return str(self) + other
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, str):
            return other + str(self)
        return NotImplemented


@dataclass
class ToolRequest:
    tools: list[dict] | None  # None: no tools
    tool_choice: str | dict  # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
    parallel_tool_calls: bool = True
    constraint: object = None  # "required" / named: the StructuredOutputsParams forcing the call (forced_tools.py)

    @property
    def named(self) -> str | None:
        return self.tool_choice["function"]["name"] if isinstance(self.tool_choice, dict) else None

    @property
    def forced(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, dict)


def _check_tool(t, i: int) -> dict:
    p = f"tools.[{i}]"
    if not isinstance(t, dict):
        raise _bad(f"{p} must be an object", p)
    if t.get("type") != "function":
        raise _bad(f"{p}.type must be \"function\", got {t.get('type')!r}", f"{p}.type")
    f = t.get("function")
    if not isinstance(f, dict):
        raise _bad(f"{p}.function must be an object", f"{p}.function")
    if not isinstance(f.get("name"), str) or not f["name"].strip():
        raise _bad(f"{p}.function.name must be a non-empty string", f"{p}.function.name")
    if f.get("description") is not None and not isinstance(f["description"], str):
        raise _bad(f"{p}.function.description must be a string", f"{p}.function.description")
    params = f.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise _bad(f"{p}.function.parameters must be a JSON schema object", f"{p}.function.parameters")
    if f.get("strict") is not None and not isinstance(f["strict"], bool):
        raise _bad(f"{p}.function.strict must be a boolean", f"{p}.function.strict")
    return t


def parse_tool_fields(body: dict) -> ToolRequest:
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise _bad(f"'{legacy}' (the deprecated function-calling API) is not supported; use 'tools' "
                       "and 'tool_choice'", legacy)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _bad("'tools' must be an array of function tools", "tools")
        tools = [_check_tool(t, i) for i, t in enumerate(tools)] or None
    names = [t["function"]["name"] for t in tools or ()]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _bad(f"'tools' names must be unique; repeated: {dup}", "tools")
    choice = body.get("tool_choice")
    if choice == "required" and isinstance(body.get("tools"), list) and not body["tools"]:
        choice = "none"  # "required" with an empty tools list acts as "none" (OpenAI's rule, which vLLM follows)
    if choice is None:
        choice = "auto" if tools else "none"
    elif isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise _bad(f"'tool_choice' must be one of {list(TOOL_CHOICES)} or a named function, got {choice!r}",
                       "tool_choice")
    elif isinstance(choice, dict):
        f = choice.get("function")
        if choice.get("type") != "function" or not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise _bad("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                       "tool_choice")
        if f["name"] not in names:
            raise _bad(f"'tool_choice' names {f['name']!r}, which is not in 'tools'", "tool_choice")
    else:
        raise _bad("'tool_choice' must be a string or an object", "tool_choice")
    if choice != "none" and not tools:
        raise _bad("'tool_choice' needs 'tools'", "tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is None:
        parallel = True
    elif not isinstance(parallel, bool):
        raise _bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    req = ToolRequest(tools=tools, tool_choice=choice, parallel_tool_calls=parallel)
    if req.forced:
        req.constraint = _forcing_constraint(body, req)
    return req


def _forcing_constraint(body: dict, req: ToolRequest):
    from .forced_tools import forced_schema
    from .structured_request import tool_choice_constraint

    what = f"naming {req.named!r}" if req.named else '"required"'
    try:
        schema, param = forced_schema(req.tools, req.tool_choice, req.parallel_tool_calls)
    except ValueError as e:
        raise _bad(str(e), "tools") from None
    return tool_choice_constraint(body, schema, param, what)


def _tool_call(c, p: str) -> dict:
    if not isinstance(c, dict):
        raise _bad(f"{p} must be an object", p)
    if c.get("type", "function") != "function":
        raise _bad(f"{p}.type must be \"function\"", f"{p}.type")
    if not isinstance(c.get("id"), str):
        raise _bad(f"{p}.id must be a string", f"{p}.id")
    f = c.get("function")
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
        raise _bad(f"{p}.function must be an object with a name", f"{p}.function")
    raw = f.get("arguments")
    if raw is None or raw == "":
        args = {}
    elif isinstance(raw, str):
        try:
            args = json.loads(raw)
        except (ValueError, RecursionError):
            raise _bad(f"{p}.function.arguments must be JSON text of an object", f"{p}.function.arguments") from None
    else:
        args = raw
    if not isinstance(args, dict):
        raise _bad(f"{p}.function.arguments must be a JSON object", f"{p}.function.arguments")
    return {"id": c["id"], "type": "function", "function": {"name": f["name"], "arguments": JSONArgs(args)}}


def message_tool_fields(m: dict, role: str, param: str) -> dict:
    """The tool-related fields of one message, checked, as the template receives them."""
    out: dict = {}
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise _bad(f"{param}.tool_calls: only assistant messages carry tool calls", f"{param}.tool_calls")
        if not isinstance(calls, list):
            raise _bad(f"{param}.tool_calls must be an array", f"{param}.tool_calls")
        if calls:
            out["tool_calls"] = [_tool_call(c, f"{param}.tool_calls.[{j}]") for j, c in enumerate(calls)]
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise _bad(f"{param}.tool_call_id must be a string (the id of the call this answers)",
                       f"{param}.tool_call_id")
        out["tool_call_id"] = m["tool_call_id"]
    if role == "assistant":  # earlier thinking, for templates that show it (interleaved thinking)
        for key in ("reasoning", "reasoning_content"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise _bad(f"{param}.{key} must be a string", f"{param}.{key}")
                out[key] = m[key]
    return out
