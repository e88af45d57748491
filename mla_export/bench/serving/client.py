"""One streamed /v1/completions request, timed as vLLM's request function times it: TTFT from the
send to the first token chunk, one ITL per later token chunk, latency (E2EL) to the last token
chunk; the output token count from the server's `usage` (asked for with
stream_options.include_usage), else by tokenizing the streamed text with the export's tokenizer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx

from mla_export.bench.serving.sse import SSEDecoder, parse_completion_event


@dataclass
class RequestOutput:
    """vLLM's RequestFuncOutput (seconds), plus where the output count came from."""

    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    error: str = ""
    start_time: float = 0.0
    client_queue_time: float = 0.0
    output_tokens_from: str = ""  # "usage" | "tokenizer"
    finish_reason: str | None = None


def completion_payload(model: str, prompt: str | list[int], max_tokens: int, ignore_eos: bool, extra_body: dict | None) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    if extra_body:
        body.update(extra_body)
    return body


def _error_text(status: int, raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return f"HTTP {status}: {text[:500]}"


async def stream_completion(client: httpx.AsyncClient, url: str, payload: dict, prompt_len: int, tokenizer,
                            headers: dict | None = None) -> RequestOutput:
    """One timed request. A pooled connection the server closed before answering (llama-server's
    cpp-httplib ends a keep-alive connection after a few requests) is retried once on a fresh
    one: the request never reached the server, and the clock restarts with the retry."""
    out = await _stream_once(client, url, payload, prompt_len, tokenizer, headers)
    if out.error.startswith("RemoteProtocolError: Server disconnected without sending a response"):
        out = await _stream_once(client, url, payload, prompt_len, tokenizer, headers)
    return out


async def _stream_once(client: httpx.AsyncClient, url: str, payload: dict, prompt_len: int, tokenizer,
                       headers: dict | None = None) -> RequestOutput:
    out = RequestOutput(prompt_len=prompt_len)
    decoder = SSEDecoder()
    usage: dict | None = None
    first = False
    st = time.perf_counter()
    out.start_time = last = st
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                out.error = _error_text(resp.status_code, await resp.aread())
                return out
            async for chunk in resp.aiter_bytes():
                now = time.perf_counter()  # every event of one network read arrived now
                for data in decoder.feed(chunk):
                    ev = parse_completion_event(data)
                    if ev.error:
                        out.error = ev.error
                        return out
                    if ev.usage is not None:
                        usage = ev.usage
                    if ev.finish_reason is not None:
                        out.finish_reason = ev.finish_reason
                    if ev.is_token:
                        if not first:
                            first, out.ttft = True, now - st
                        else:
                            out.itl.append(now - last)
                        last = now
                        out.generated_text += ev.text
            for data in decoder.close():
                ev = parse_completion_event(data)
                if ev.usage is not None:
                    usage = ev.usage
    except httpx.HTTPError as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    if not first:
        out.error = "the stream ended without a token chunk (no TTFT)"
        return out
    out.latency = last - st
    n = usage.get("completion_tokens") if usage else None
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        out.output_tokens, out.output_tokens_from = n, "usage"
        p = usage.get("prompt_tokens")
        if isinstance(p, int) and not isinstance(p, bool) and p > 0:
            out.prompt_len = p  # the server's own count of the prompt, as vLLM takes it
    else:
        out.output_tokens = len(tokenizer.encode(out.generated_text, add_special_tokens=False).ids)
        out.output_tokens_from = "tokenizer"
    out.success = True
    return out
