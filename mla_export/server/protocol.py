"""OpenAI-compatible request parsing and response bodies for `mla-export serve`.

Parsing is explicit (no framework magic) so that every rejection is a 400 with an OpenAI-style
error body naming the offending parameter:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}

Unknown fields are ignored (as OpenAI-compatible servers commonly do), but a *known* field of
the wrong type or out of range is an error, and so is a known OpenAI or vLLM option this server
cannot honour (chat's echo, best_of > n, suffix, the legacy `functions`): silently ignoring it
would return something other than what the client asked for. Honoured beyond OpenAI's basics:
logprobs / top_logprobs, completions' echo (max_tokens 0 with it), presence and frequency
penalties, logit_bias, structured outputs (response_format json_object / json_schema and vLLM's
structured_outputs / guided_*, parsed in structured_request.py), chat `tools`, `tool_choice`,
`parallel_tool_calls` and tool messages (tool_request.py), and vLLM's prompt_logprobs, top_k,
min_p, repetition_penalty, min_tokens, bad_words, allowed_token_ids, truncate_prompt_tokens,
include_stop_str_in_output, stop_token_ids, ignore_eos.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .tool_request import ToolRequest, message_tool_fields, parse_tool_fields
from .api_error import APIError, bad_request, error_body  # noqa: F401 (P.APIError is the handlers' spelling)

__all__ = [
    "APIError",
    "CompletionRequest",
    "ChatRequest",
    "error_body",
    "parse_json_body",
    "parse_completion_request",
    "parse_chat_request",
    "new_id",
]

MAX_N = 16
MAX_STOP = 16


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def parse_json_body(raw: bytes) -> dict:
    if not raw:
        raise bad_request("the request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    # JSON may escape half a UTF-16 pair ("\ud800"); such a string is no text and would fail
    # deep in the tokenizer. Only bodies with such an escape are walked.
    if _SURROGATE_ESCAPE.search(raw):
        _check_text(body, "body")
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _check_text(v: Any, where: str) -> None:
    stack = [(v, where)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise bad_request(f"'{where}' holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                                  "which is not text", where) from None
        elif isinstance(v, dict):
            stack.extend((x, k if where == "body" else f"{where}.{k}") for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]") for i, x in enumerate(v))


# ---- typed field readers ---------------------------------------------------------------------

def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(v), type(v).__name__)


def _get_int(body: dict, name: str, default, lo=None, hi=None):
    v = body.get(name, None)
    if v is None:
        return default
    # JSON has one number type: accept 3.0 for an integer field, reject 3.5 and booleans.
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise bad_request(f"'{name}' must be an integer, got {_type_name(v)} {v!r}", name)
    v = int(v)
    if lo is not None and v < lo:
        raise bad_request(f"'{name}' must be >= {lo}, got {v}", name)
    if hi is not None and v > hi:
        raise bad_request(f"'{name}' must be <= {hi}, got {v}", name)
    return v


def _get_float(body: dict, name: str, default, lo=None, hi=None):
    v = body.get(name, None)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad_request(f"'{name}' must be a number, got {_type_name(v)} {v!r}", name)
    v = float(v)
    if not math.isfinite(v):
        raise bad_request(f"'{name}' must be finite", name)
    if lo is not None and v < lo:
        raise bad_request(f"'{name}' must be >= {lo}, got {v}", name)
    if hi is not None and v > hi:
        raise bad_request(f"'{name}' must be <= {hi}, got {v}", name)
    return v


def _get_typed(body: dict, name: str, default, kind: type, what: str, show_value: bool):
    """body[name] when it is a `kind` (absent or null: default), else a 400 naming the field."""
    v = body.get(name, None)
    if v is None:
        return default
    if not isinstance(v, kind):
        raise bad_request(f"'{name}' must be {what}, got {_type_name(v)}" + (f" {v!r}" if show_value else ""), name)
    return v


def _get_bool(body: dict, name: str, default: bool) -> bool:
    return _get_typed(body, name, default, bool, "a boolean", show_value=True)


def _get_str(body: dict, name: str, default):
    return _get_typed(body, name, default, str, "a string", show_value=False)


def _is_token_list(v) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


# ---- sampling options shared by both endpoints ---------------------------------------------

@dataclass
class Sampling:
    max_tokens: int | None  # None: up to the context length (chat default)
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    n: int
    stop: list[str]
    stop_token_ids: list[int]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict | None = None
    logprobs: int | None = None  # top log-probabilities per token (None: no logprobs)
    include_stop_str_in_output: bool = False
    bad_words: list[str] = field(default_factory=list)  # vLLM's: words never generated
    allowed_token_ids: list[int] | None = None  # vLLM's: only these may be generated
    truncate_prompt_tokens: int | None = None  # vLLM's: keep only the prompt's last k tokens
    echo: bool = False  # completions: the prompt is returned before the completion (and its logprobs)
    prompt_logprobs: int | None = None  # vLLM's extra: each prompt token's logprob and this many top ones
    structured_outputs: Any = None  # runtime StructuredOutputsParams (structured_request.py), or None

    @property
    def engine_prompt_logprobs(self) -> int | None:
        """Top entries per prompt token the engine must return (echo with logprobs needs them too)."""
        wanted = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None) if k is not None]
        return max(wanted) if wanted else None


# vLLM request fields whose feature is not built here: refused by name rather than ignored
_NOT_BUILT = {
    "use_beam_search": "beam search",
}


def _reject_unsupported(body: dict, chat: bool) -> None:
    for name, what in _NOT_BUILT.items():
        if body.get(name) not in (None, False, [], {}):
            raise bad_request(f"'{name}': {what} is not supported by this server", name)
    # chat's tools / functions: tool_request.py; response_format: structured_request.py
    if not chat:
        if body.get("suffix"):
            raise bad_request("'suffix' is not supported by this server", "suffix")


def _parse_sampling(body: dict, *, chat: bool, defaults: dict | None = None) -> Sampling:
    """`defaults`: the model's generation_config values (SamplingParams names) for fields the
    request does not give (vLLM's --generation-config auto)."""
    from mla_export.runtime.sampling import token_id_key

    from .structured_request import parse_structured_outputs

    _reject_unsupported(body, chat)
    structured = parse_structured_outputs(body)
    d = defaults or {}
    if chat:
        # `max_completion_tokens` is the newer name for the same limit.
        mt = _get_int(body, "max_completion_tokens", None, lo=1)
        if mt is None:
            mt = _get_int(body, "max_tokens", d.get("max_tokens"), lo=1)
    else:
        # max_tokens 0 with echo: only the prompt (and its logprobs) comes back (lm-eval's loglikelihood).
        mt = _get_int(body, "max_tokens", d.get("max_tokens", 16), lo=0 if body.get("echo") is True else 1)
    temperature = _get_float(body, "temperature", d.get("temperature", 1.0), lo=0.0, hi=2.0)
    top_p = _get_float(body, "top_p", d.get("top_p", 1.0), lo=0.0, hi=1.0)
    if top_p == 0.0:
        raise bad_request("'top_p' must be in (0, 1]", "top_p")
    top_k = _get_int(body, "top_k", d.get("top_k", -1), lo=-1)  # -1 or 0 (vLLM's newer spelling): off
    seed = _get_int(body, "seed", None, lo=-(2**63), hi=2**64 - 1)
    if seed is not None:
        seed %= 2**63  # numpy seeds are non-negative; keep the mapping deterministic
    n = _get_int(body, "n", 1, lo=1, hi=MAX_N)
    if not chat:
        best_of = _get_int(body, "best_of", None, lo=1)
        if best_of is not None and best_of != n:
            raise bad_request("'best_of' different from 'n' is not supported by this server", "best_of")

    stop_strs: list[str] = []
    stop_ids: list[int] = []
    stop = body.get("stop")
    if stop is not None:
        items = [stop] if isinstance(stop, (str, int)) and not isinstance(stop, bool) else stop
        if not isinstance(items, list):
            raise bad_request(f"'stop' must be a string or an array of strings (or token ids), got {_type_name(stop)}", "stop")
        if len(items) > MAX_STOP:
            raise bad_request(f"'stop' has at most {MAX_STOP} entries", "stop")
        for s in items:
            if isinstance(s, str):
                if not s:
                    raise bad_request("'stop' strings must not be empty", "stop")
                stop_strs.append(s)
            elif isinstance(s, int) and not isinstance(s, bool):
                if s < 0:
                    raise bad_request("'stop' token ids must be >= 0", "stop")
                stop_ids.append(s)
            else:
                raise bad_request(f"'stop' entries must be strings or token ids, got {_type_name(s)}", "stop")
    extra_ids = body.get("stop_token_ids")
    if extra_ids is not None:
        if not isinstance(extra_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in extra_ids):
            raise bad_request("'stop_token_ids' must be an array of non-negative integers", "stop_token_ids")
        stop_ids.extend(extra_ids)

    stream = _get_bool(body, "stream", False)
    include_usage = False
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        include_usage = _get_bool(so, "include_usage", False)
    if chat:  # logprobs: a boolean, top_logprobs how many alternatives (OpenAI's chat API)
        want = _get_bool(body, "logprobs", False)
        top = _get_int(body, "top_logprobs", None, lo=0, hi=20)
        if top is not None and not want:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = (top or 0) if want else None
    else:  # the legacy completions API: logprobs is the number of alternatives
        logprobs = _get_int(body, "logprobs", None, lo=0, hi=20)
    logit_bias = body.get("logit_bias")
    if logit_bias is not None:
        if not isinstance(logit_bias, dict):
            raise bad_request(f"'logit_bias' must be an object of token id -> bias, got {_type_name(logit_bias)}",
                              "logit_bias")
        for k, v in logit_bias.items():
            if token_id_key(k) is None:
                raise bad_request(f"'logit_bias' keys must be token ids, got {k[:40]!r}", "logit_bias")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                raise bad_request(f"'logit_bias' values must be numbers in [-100, 100], got {v!r}", "logit_bias")
    echo = False if chat else _get_bool(body, "echo", False)  # chat's echo: ChatRequest.echo_text
    prompt_logprobs = _get_int(body, "prompt_logprobs", None, lo=0, hi=20)
    if prompt_logprobs is not None and stream:
        raise bad_request("'prompt_logprobs' is not supported with 'stream': true (ask for them non-streamed)",
                          "prompt_logprobs")
    bad_words = body.get("bad_words")
    if bad_words is not None and not (isinstance(bad_words, list) and len(bad_words) <= 64 and all(
            isinstance(w, str) and w.strip() for w in bad_words)):
        raise bad_request("'bad_words' must be an array of at most 64 non-empty strings", "bad_words")
    allowed = body.get("allowed_token_ids")
    if allowed is not None and not (isinstance(allowed, list) and allowed and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in allowed)):
        raise bad_request("'allowed_token_ids' must be a non-empty array of token ids", "allowed_token_ids")
    truncate = _get_int(body, "truncate_prompt_tokens", None, lo=-1)
    if truncate == 0:
        raise bad_request("'truncate_prompt_tokens' must be >= 1 (or -1: the model's context)", "truncate_prompt_tokens")
    min_tokens = _get_int(body, "min_tokens", 0, lo=0)
    if mt is not None and min_tokens > mt:
        raise bad_request(f"'min_tokens' ({min_tokens}) must not exceed max_tokens ({mt})", "min_tokens")
    return Sampling(
        max_tokens=mt, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, n=n,
        stop=stop_strs, stop_token_ids=sorted(set(stop_ids)),
        ignore_eos=_get_bool(body, "ignore_eos", False), stream=stream,
        include_usage=include_usage, return_token_ids=_get_bool(body, "return_token_ids", False),
        presence_penalty=_get_float(body, "presence_penalty", 0.0, lo=-2.0, hi=2.0),
        frequency_penalty=_get_float(body, "frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        repetition_penalty=_get_float(body, "repetition_penalty", d.get("repetition_penalty", 1.0), lo=1e-6, hi=100.0),
        min_p=_get_float(body, "min_p", d.get("min_p", 0.0), lo=0.0, hi=1.0), min_tokens=min_tokens,
        logit_bias={token_id_key(k): float(v) for k, v in logit_bias.items()} if logit_bias else None,
        logprobs=logprobs,
        include_stop_str_in_output=_get_bool(body, "include_stop_str_in_output", False), echo=echo,
        bad_words=list(bad_words or []), allowed_token_ids=allowed, truncate_prompt_tokens=truncate,
        prompt_logprobs=prompt_logprobs, structured_outputs=structured)


# ---- endpoint requests ------------------------------------------------------------------------

@dataclass
class CompletionRequest:
    model: str | None
    prompts: list[str | list[int]]  # one entry per prompt: text or token ids
    sampling: Sampling


@dataclass
class ChatRequest:
    model: str | None
    messages: list[dict]
    sampling: Sampling
    add_generation_prompt: bool = True
    template_kwargs: dict = field(default_factory=dict)
    tool: ToolRequest | None = None  # tools, tool_choice, parallel_tool_calls
    # vLLM's chat `echo`: the last message's content put before each reply when that message has
    # the reply's role (assistant, or the last message's own without add_generation_prompt): a
    # partial answer the model continues comes back whole. None: echo off.
    echo_text: str | None = None


def parse_completion_request(body: dict, defaults: dict | None = None) -> CompletionRequest:
    model = _get_str(body, "model", None)
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("'prompt' is required", "prompt")
    p = body["prompt"]
    if isinstance(p, str):
        prompts: list = [p]
    elif _is_token_list(p):
        prompts = [list(p)]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        prompts = list(p)
    elif isinstance(p, list) and p and all(_is_token_list(x) for x in p):
        prompts = [list(x) for x in p]
    else:
        raise bad_request("'prompt' must be a string, an array of strings, an array of token ids "
                          "or an array of arrays of token ids (none empty)", "prompt")
    for x in prompts:
        if isinstance(x, str) and not x:
            raise bad_request("'prompt' must not be empty", "prompt")
        if isinstance(x, list) and any(t < 0 for t in x):
            raise bad_request("'prompt' token ids must be >= 0", "prompt")
    if len(prompts) > 64:
        raise bad_request("at most 64 prompts per request", "prompt")
    return CompletionRequest(model=model, prompts=prompts, sampling=_parse_sampling(body, chat=False, defaults=defaults))


_ROLES = ("system", "developer", "user", "assistant", "tool")


# chat_template_kwargs that vLLM refuses too (the template is the server's; the prompt is always text)
_VLLM_REFUSED_KWARGS = ("chat_template", "tokenize")


def _template_kwargs(body: dict) -> tuple[bool, dict]:
    """(add_generation_prompt, the chat_template_kwargs left as template variables). A name the
    renderer sets from other fields (messages, tools) or its own helpers is refused naming it;
    add_generation_prompt is merged with the top-level field (vLLM merges it, the top-level
    winning: here the two must agree when both are given, so neither is silently ignored)."""
    from ..runtime.chat_template import RENDERER_VARIABLES

    given = "add_generation_prompt" in body and body["add_generation_prompt"] is not None
    agp = _get_bool(body, "add_generation_prompt", True)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return agp, {}
    if not isinstance(kwargs, dict):
        raise bad_request(f"'chat_template_kwargs' must be an object, got {_type_name(kwargs)}", "chat_template_kwargs")
    kwargs = dict(kwargs)
    if "add_generation_prompt" in kwargs:
        inner = kwargs.pop("add_generation_prompt")
        param = "chat_template_kwargs.add_generation_prompt"
        if not isinstance(inner, bool):
            raise bad_request(f"'{param}' must be a boolean, got {_type_name(inner)}", param)
        if given and inner != agp:
            raise bad_request(f"'{param}' ({inner}) contradicts 'add_generation_prompt' ({agp}); give one", param)
        agp = inner
    for key in kwargs:
        if key in RENDERER_VARIABLES or key in _VLLM_REFUSED_KWARGS:
            where = {"messages": "the request's 'messages'", "tools": "the request's 'tools'"}.get(
                key, "the server" if key in _VLLM_REFUSED_KWARGS else "the renderer (one of its functions)")
            raise bad_request(f"'chat_template_kwargs.{key}' is reserved: {where} sets it",
                              f"chat_template_kwargs.{key}")
    return agp, kwargs


def parse_chat_request(body: dict, defaults: dict | None = None) -> ChatRequest:
    model = _get_str(body, "model", None)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(msgs):
        param = f"messages.[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{param} must be an object", param)
        role = m.get("role")
        if role not in _ROLES:
            raise bad_request(f"{param}.role must be one of {list(_ROLES)}, got {role!r}", f"{param}.role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text is supported
            texts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    where = f"{param}.content.[{j}]"
                    if kind is not None and kind != "text":  # image_url, input_audio, file, ...: never dropped silently
                        raise bad_request(f"{where}: {kind!r} content is not supported: this server runs the text "
                                          "model only (a multimodal checkpoint's vision tower is not exported); "
                                          "send text parts", where)
                    raise bad_request(f"{where}: a content part must be {{'type': 'text', 'text': <string>}}", where)
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            if role != "assistant":
                raise bad_request(f"{param}.content is required", f"{param}.content")
            content = None if m.get("tool_calls") else ""  # templates test `content is none` beside tool calls
        elif not isinstance(content, str):
            raise bad_request(f"{param}.content must be a string or an array of text parts", f"{param}.content")
        msg = {"role": role, "content": content}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        msg.update(message_tool_fields(m, role, param))
        out.append(msg)
    agp, kwargs = _template_kwargs(body)
    tool = parse_tool_fields(body)
    echo_text = None
    if _get_bool(body, "echo", False):
        reply_role = "assistant" if agp else out[-1]["role"]
        echo_text = (out[-1]["content"] or "") if out[-1]["role"] == reply_role else ""
    return ChatRequest(model=model, messages=out, sampling=_parse_sampling(body, chat=True, defaults=defaults),
                       add_generation_prompt=agp, template_kwargs=kwargs, tool=tool, echo_text=echo_text)


# ---- response bodies ----------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _response_body(kind: str, rid: str, model: str, created: int, choices: list[dict], use: dict | None) -> dict:
    body = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices,
            "system_fingerprint": None}
    if use is not None:
        body["usage"] = use
    return body


def completion_body(rid: str, model: str, created: int, choices: list[dict], use: dict | None) -> dict:
    return _response_body("text_completion", rid, model, created, choices, use)


def chat_body(rid: str, model: str, created: int, choices: list[dict], use: dict | None) -> dict:
    return _response_body("chat.completion", rid, model, created, choices, use)


def chat_chunk(rid: str, model: str, created: int, choices: list[dict], use: dict | None = None) -> dict:
    body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices, "system_fingerprint": None}
    if use is not None:
        body["usage"] = use
    return body


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


SSE_DONE = sse("[DONE]")


def now() -> int:
    return int(time.time())
