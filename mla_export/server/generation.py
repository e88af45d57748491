"""One generation request, from admitted prompt ids to the HTTP response (JSON or SSE).

`respond(st, request, endpoint, prompt_ids, sampling, chat)` submits every choice to the
state's engine client (asking for deltas), keeps each choice's tokens and text from the deltas
that come back (deltas.py) and answers with one ASGI response that races the work against a client disconnect;
whatever did not finish is aborted in the engine when the response ends.

Engine failures become errors: a JSON error for a non-streamed request, one SSE `error` event
before `[DONE]` for a streamed one (the stream has already answered 200).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from . import protocol as P
from .engine_loop import Aborted, EngineDead, QueueFull, SeqRequest, ShuttingDown
from .marker_text import MarkerDecoder

__all__ = ["respond"]

log = logging.getLogger("mla_export.server")


# ---- per-request choice state -----------------------------------------------------------------

@dataclass
class _Choice:
    """One choice as the engine's deltas build it up: tokens, logprobs and text are appended to
    (a step's work does not grow with the output), the text joined only where a whole text is
    asked for (the response body, the finishing step). A reasoning / tool-call parser (`out`)
    is fed each step's new text."""

    index: int
    request_id: str
    stop: list[str]
    include_stop: bool = False  # include_stop_str_in_output
    token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None  # per token {token id: Logprob} (the request's logprobs)
    prompt_logprobs: list | None = None  # per prompt token (None first), once the engine has them
    echo_text: str | None = None  # completions' echo: the prompt's text, sent before the completion
    prompt_ids: list[int] = field(default_factory=list)
    first_token_text: str = ""  # the prompt's first token (it has no logprob: nothing precedes it)
    echo_sent: bool = False
    keep_output: bool = True  # False for max_tokens 0 with echo: the one token the engine ran is dropped
    pieces: list[str] = field(default_factory=list)  # text emitted so far, in pieces (see `text`)
    text_len: int = 0  # characters emitted so far
    final_text: str | None = None  # the whole text, once finished
    finished: bool = False
    finish_reason: str | None = None
    out: Any = None  # chat_output.ChoiceOutput: reasoning / tool calls split out of the text (None: plain text)
    marker_text: Any = None  # marker_text.MarkerText: the text kept with its marker tokens (_MarkerDetok)

    @property
    def text(self) -> str:
        """The text emitted so far (its pieces joined once, and kept as one)."""
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""

    @text.setter
    def text(self, value: str) -> None:
        self.pieces[:] = [value] if value else []
        self.text_len = len(value)

    def add_text(self, piece: str) -> None:
        if piece:
            self.pieces.append(piece)
            self.text_len += len(piece)


class _Detok:
    """The text of a choice's deltas, as the engine sends it. Stop strings are matched once, in
    the engine, on its thread (runtime/stop_strings.py): its text is already cut at a stop string
    and holds back what may still grow into one, and an incomplete UTF-8 character. So a step
    here only takes the delta's text; the finishing delta brings the engine's final decode."""

    def __init__(self, decode: Callable[[list[int]], str] | None):
        self.decode = decode

    def advance(self, ch: _Choice, d) -> str:
        """The new text to emit for delta `d` (its tokens already in ch.token_ids). When the
        choice ends, `ch.final_text` is its whole text (what a non-streamed response returns)."""
        # An engine that sends no text: the decode of the tokens so far (all of them per step; not
        # on the serving path: an engine with a tokenizer always sends its text).
        if d.new_text is None:
            return _advance_to(ch, self.decode(ch.token_ids) if self.decode is not None else "", d.finished)
        if d.finished and d.text is not None:
            return _advance_to(ch, d.text, True)
        return d.new_text


def _advance_to(ch: _Choice, full: str, finished: bool) -> str:
    """What `full` (the choice's whole text now) adds to what was emitted."""
    if finished:
        ch.final_text = full  # the final decode: may differ from the streamed text's tail
        return _suffix_after(full, ch.text)
    return full[ch.text_len:]  # until then the text only grows


def _text(ch: _Choice) -> str:
    return ch.final_text if ch.final_text is not None else ch.text


def _suffix_after(text: str, emitted: str) -> str:
    """What is still to be sent of `text` after `emitted` was sent. Emitted text is never taken
    back; if the decode changed under it (not expected: only trailing U+FFFD are held back,
    and UTF-8 resynchronises), the rest after the common part is sent."""
    if text.startswith(emitted):
        return text[len(emitted):]
    n = 0
    for a, b in zip(text, emitted):
        if a != b:
            break
        n += 1
    return text[max(n, len(emitted)):] if len(text) > len(emitted) else ""



# ---- admission ------------------------------------------------------------------------------

def engine_params(st, s: P.Sampling, prompt_len: int, choice: int):
    """The engine's SamplingParams of one choice; a 400 when the request cannot fit the context."""
    from mla_export.runtime.sampling import SamplingParams

    max_tokens = s.max_tokens
    if st.max_model_len is not None:
        room = st.max_model_len - prompt_len
        if room < 1:
            raise P.bad_request(
                f"This model's maximum context length is {st.max_model_len} tokens, however the prompt has "
                f"{prompt_len} tokens; no room is left to generate.", "prompt", "context_length_exceeded")
        if max_tokens is None:
            max_tokens = room
        elif prompt_len + max_tokens > st.max_model_len:
            raise P.bad_request(
                f"This model's maximum context length is {st.max_model_len} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the "
                f"completion). Please reduce the prompt or max_tokens.", "max_tokens", "context_length_exceeded")
    elif max_tokens is None:
        max_tokens = 16
    max_tokens = max(max_tokens, 1)  # max_tokens 0 (echo): the engine runs the prompt; its token is dropped
    seed = None if s.seed is None else (s.seed + choice) % 2**63
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                              seed=seed, stop_token_ids=tuple(s.stop_token_ids), ignore_eos=s.ignore_eos,
                              presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                              repetition_penalty=s.repetition_penalty, min_p=s.min_p, min_tokens=s.min_tokens,
                              logit_bias=s.logit_bias, logprobs=s.logprobs,
                              prompt_logprobs=s.engine_prompt_logprobs, bad_words=tuple(s.bad_words),
                              allowed_token_ids=None if s.allowed_token_ids is None else tuple(s.allowed_token_ids),
                              structured_outputs=s.structured_outputs, stop=tuple(s.stop),
                              include_stop_str_in_output=s.include_stop_str_in_output,
                              output_kind="delta")  # the choice keeps its tokens and text (_Choice)
    except ValueError as e:  # SamplingParams' domain check (SamplingParamError names the field)
        raise P.bad_request(str(e), getattr(e, "param", None)) from None


async def start(st, prompt_ids: list[list[int]], s: P.Sampling, prefix: str,
                echo_texts: list[str] | None = None) -> tuple[asyncio.Queue, list[_Choice], list[int]]:
    if s.stop and st.tokenizer is None:
        raise P.bad_request("stop strings need a tokenizer; this model has none (use token ids)", "stop")
    seqs, choices = [], []
    for p, ids in enumerate(prompt_ids):
        for i in range(s.n):
            idx = p * s.n + i
            rid = f"{prefix}-{idx}"
            seqs.append(SeqRequest(rid, ids, engine_params(st, s, len(ids), i), parent=f"{prefix}-p{p}"))
            choices.append(_Choice(index=idx, request_id=rid, stop=list(s.stop), include_stop=s.include_stop_str_in_output,
                                   echo_text=echo_texts[p] if s.echo and echo_texts else None,
                                   keep_output=s.max_tokens != 0, prompt_ids=ids,
                                   first_token_text=_token_text(st, ids[0]) if s.echo else ""))
    try:
        q = await st.client.submit(seqs)
    except QueueFull:
        st.metrics.observe_rejected("queue_full")
        raise P.APIError(429, f"The server is at capacity ({st.client.capacity} sequences running or queued); "
                              "retry later.", type="rate_limit_error", code="queue_full",
                         headers={"Retry-After": "1"}) from None
    except ShuttingDown:
        raise P.APIError(503, "The server is shutting down.", type="server_error", code="shutting_down") from None
    except EngineDead as e:
        raise P.APIError(503, f"The engine failed: {e}", type="server_error", code="engine_error") from None
    except ValueError as e:  # the engine's own validation (context, cache capacity, token ids, ...)
        raise P.bad_request(str(e), getattr(e, "param", None)) from None
    return q, choices, [len(x) for x in prompt_ids]


# ---- one ASGI response that races the work against a client disconnect ---------------------

class Generation(Response):
    def __init__(self, st, produce, choices: list[_Choice], status_code: int = 200):
        self.st = st
        self.produce = produce
        self.choices = choices
        self.status_code = status_code

    async def __call__(self, scope, receive, send):
        async def wait_disconnect():
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return

        work = asyncio.ensure_future(self.produce(send))
        gone = asyncio.ensure_future(wait_disconnect())
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                log.info("client disconnected: aborting %s", [c.request_id for c in self.choices if not c.finished])
                work.cancel()
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
            await asyncio.gather(work, gone, return_exceptions=True)
            # Whatever did not finish in the engine leaves it now (idempotent).
            self.st.client.abort([c.request_id for c in self.choices if not c.finished])
        if work.done() and not work.cancelled() and work.exception() is not None:
            exc = work.exception()
            if not isinstance(exc, OSError):
                log.error("generation failed", exc_info=exc)


async def next_events(st, detok: _Detok, q: asyncio.Queue, by_id: dict[str, _Choice]):
    """Wait for engine outputs (deltas.Delta, or Aborted); returns (choice, new_text,
    new_token_ids, new_logprobs) per choice updated and raises APIError on a server-side abort."""
    item = await q.get()
    items = [item]
    while not q.empty():
        items.append(q.get_nowait())
    # Several deltas queued for one sequence make one event (one SSE chunk carrying all their
    # tokens), unless the sequence was aborted.
    by_seq: dict[str, Any] = {}
    for item in items:
        got = by_seq.get(item.request_id)
        if isinstance(got, Aborted):
            continue
        if isinstance(item, Aborted) or got is None:
            by_seq[item.request_id] = item if isinstance(item, Aborted) else [item]
        else:
            got.append(item)
    events = []
    for rid, got in by_seq.items():
        ch = by_id.get(rid)
        if ch is None or ch.finished:
            continue
        if isinstance(got, Aborted):
            ch.finished = True
            ch.finish_reason = "abort"
            if got.reason == "shutdown":
                raise P.APIError(503, "The server shut down before the request finished.", type="server_error",
                                 code="shutting_down")
            raise P.APIError(500, f"The engine failed: {got.error}", type="server_error", code="engine_error")
        last = got[-1]
        for d in got:
            if d.prompt_logprobs is not None:
                ch.prompt_logprobs = d.prompt_logprobs
        if not ch.keep_output:  # max_tokens 0 with echo: the prompt was run, nothing generated is returned
            ch.finished, ch.finish_reason = True, "length"
            if not last.finished:
                st.client.abort([ch.request_id], reason="stop")
            events.append((ch, "", [], [] if last.new_logprobs is not None else None))
            continue
        start = len(ch.token_ids)
        pieces = []
        for d in got:
            ch.token_ids += d.new_token_ids
            if d.new_logprobs is not None:
                if ch.logprobs is None:
                    ch.logprobs = []
                ch.logprobs += d.new_logprobs
            piece = detok.advance(ch, d)
            ch.add_text(piece)
            pieces.append(piece)
        new_ids = ch.token_ids[start:]
        new_logprobs = ch.logprobs[start:] if ch.logprobs is not None else None
        if last.finished:
            ch.finished = True
            ch.finish_reason = last.finish_reason or "stop"
        events.append((ch, "".join(pieces), new_ids, new_logprobs))
    return events


def completion_logprobs(token_ids: list[int], entries: list | None, offset: int = 0) -> dict | None:
    """The legacy completions API's logprobs object of these tokens (None without logprobs):
    tokens, token_logprobs, top_logprobs (token text -> logprob) and text_offset."""
    if entries is None:
        return None
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t, e in zip(token_ids, entries):
        own = e[t]
        out["tokens"].append(own.decoded_token or "")
        out["token_logprobs"].append(own.logprob)
        out["top_logprobs"].append({(lp.decoded_token or ""): lp.logprob for lp in e.values()})  # + the sampled
        out["text_offset"].append(offset)
        offset += len(own.decoded_token or "")
    return out


def chat_logprobs(token_ids: list[int], entries: list | None, top: int) -> dict | None:
    """The chat API's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    if entries is None:
        return None

    def item(lp):
        text = lp.decoded_token or ""
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for t, e in zip(token_ids, entries):
        tops = sorted((lp for lp in e.values() if lp.rank <= top), key=lambda lp: lp.rank)[:top]
        content.append(dict(item(e[t]), top_logprobs=[item(lp) for lp in tops]))
    return {"content": content}


def _token_text(st, token: int) -> str:
    return st.tokenizer.decode([token], skip_special_tokens=False) if st.tokenizer is not None else ""


def _top(entry: dict, own: int, k: int) -> dict:
    """The entry's own token and its k most likely (the engine may have computed more)."""
    return {t: lp for t, lp in entry.items() if t == own or lp.rank <= k}


def echo_logprobs(ch: _Choice, k: int) -> dict:
    """The legacy logprobs object of the echoed prompt: its first token has no logprob (None)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for t, e in zip(ch.prompt_ids, ch.prompt_logprobs or [None] * len(ch.prompt_ids)):
        text = ch.first_token_text if e is None else (e[t].decoded_token or "")
        out["tokens"].append(text)
        out["token_logprobs"].append(None if e is None else e[t].logprob)
        out["top_logprobs"].append(None if e is None else
                                   {(lp.decoded_token or ""): lp.logprob for lp in _top(e, t, k).values()})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _echo_prefix(ch: _Choice, logprobs: int | None) -> tuple[str, dict | None]:
    """(text, logprobs object) to put before the choice's first output: the prompt under echo."""
    if ch.echo_text is None or ch.echo_sent:
        return "", None
    ch.echo_sent = True
    return ch.echo_text, echo_logprobs(ch, logprobs) if logprobs is not None else None


def _joined(a: dict | None, b: dict | None) -> dict | None:
    if a is None or b is None:
        return a if b is None else b
    return {key: a[key] + b[key] for key in a}


def prompt_logprobs_json(ch: _Choice, k: int | None):
    """vLLM's prompt_logprobs: per prompt token None (the first) or {token id: {logprob, rank,
    decoded_token}} of it and the k most likely."""
    if k is None or ch.prompt_logprobs is None:
        return None
    return [None if e is None else {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
                                    for t, lp in _top(e, own, k).items()}
            for own, e in zip(ch.prompt_ids, ch.prompt_logprobs)]


def completion_choice(ch: _Choice, s: P.Sampling) -> dict:
    echo_text, echo_lps = _echo_prefix(ch, s.logprobs)
    lps = completion_logprobs(ch.token_ids, ch.logprobs, len(echo_text))
    d = {"index": ch.index, "text": echo_text + _text(ch), "logprobs": _joined(echo_lps, lps),
         "finish_reason": ch.finish_reason}
    if s.return_token_ids:
        d["token_ids"] = ch.token_ids
    if s.prompt_logprobs is not None:
        d["prompt_logprobs"] = prompt_logprobs_json(ch, s.prompt_logprobs)
    return d


def _chat_finish_reason(ch: _Choice) -> str | None:
    return "tool_calls" if ch.finished and ch.out is not None and ch.out.tools_called else ch.finish_reason


def chat_choice(ch: _Choice, want_ids: bool, top: int = 0, echo: str | None = None) -> dict:
    msg = ch.out.message(_text(ch)) if ch.out is not None else {"role": "assistant", "content": _text(ch)}
    if echo:
        msg["content"] = echo + (msg.get("content") or "")
    d = {"index": ch.index, "message": msg,
         "logprobs": chat_logprobs(ch.token_ids, ch.logprobs, top), "finish_reason": _chat_finish_reason(ch)}
    if want_ids:
        d["token_ids"] = ch.token_ids
    return d


class _MarkerDetok(_Detok):
    """Text decoded from the token ids keeping the parsers' marker tokens, in place of the
    engine's text (which skips every special token): only for tokenizers whose parser markers
    are special tokens (chat_tools.marker_decoder). Each choice's text grows from its new ids
    (marker_text.MarkerText: a short window decoded per step, stop strings matched on the held
    tail and the new piece); at the end the whole output is decoded once."""

    decode: MarkerDecoder

    def advance(self, ch: _Choice, d) -> str:
        """As _Detok's, the text cut at the first complete stop string (the engine matched them
        on its own text, which skips the markers; this text is decoded here)."""
        if ch.marker_text is None:
            ch.marker_text = self.decode.text(ch.stop, ch.include_stop)
        if d.finished:
            ch.final_text = ch.marker_text.finish(ch.token_ids)
            return _suffix_after(ch.final_text, ch.text)
        return ch.marker_text.step(d.new_token_ids)


def make_detok(decode: Callable[[list[int]], str] | None, marker_decode: MarkerDecoder | None) -> _Detok:
    return _MarkerDetok(marker_decode) if marker_decode is not None and decode is not None else _Detok(decode)


def chat_delta(ch: _Choice, delta: str, new_ids: list[int], new_lps, s: P.Sampling) -> dict | None:
    """A streamed chat choice's next chunk entry after `delta` was added to ch.text (None: nothing
    to send, e.g. text held back while it may be tool-call markup)."""
    msg = ch.out.delta(delta, ch.finished) if ch.out is not None else ({"content": delta} if delta else {})
    if (not msg and not ch.finished and not (s.return_token_ids and new_ids)
            and not (new_lps and s.logprobs is not None)):
        return None
    d: dict[str, Any] = {"index": ch.index, "delta": msg, "logprobs": chat_logprobs(new_ids, new_lps, s.logprobs or 0),
                         "finish_reason": _chat_finish_reason(ch)}
    if s.return_token_ids:
        d["token_ids"] = new_ids
    return d


async def respond(st, request: Request, endpoint: str, prompt_ids: list[list[int]], s: P.Sampling,
                  chat: bool, echo_texts: list[str] | None = None, chat_output: Callable[[], Any] | None = None,
                  decode: MarkerDecoder | None = None, chat_echo: str | None = None) -> Response:
    """`echo_texts`: completions' echo, the prompts' text; `chat_output`: makes each choice's
    ChoiceOutput (reasoning / tool-call parsing), `decode`: the text of token ids when the parsers
    need special marker tokens kept (None: the usual); `chat_echo`: chat's echo, the text put
    before each reply's content (protocol.ChatRequest.echo_text)."""
    rid = P.new_id("chatcmpl" if chat else "cmpl")
    created = P.now()
    q, choices, prompt_lens = await start(st, prompt_ids, s, rid, echo_texts)
    if chat_output is not None:
        for c in choices:
            c.out = chat_output()
    by_id = {c.request_id: c for c in choices}
    prompt_tokens = sum(prompt_lens)
    detok = make_detok(st.decode if st.tokenizer is not None else None, decode)
    served_by = getattr(q, "served_by", None)
    replica_header = [(b"x-mla-replica", served_by.encode())] if served_by else []

    def use() -> dict:
        return P.usage(prompt_tokens, sum(len(c.token_ids) for c in choices))

    if not s.stream:
        async def produce(send):
            status, body = 200, None
            try:
                while not all(c.finished for c in choices):
                    await next_events(st, detok, q, by_id)
                ordered = sorted(choices, key=lambda c: c.index)
                made = [chat_choice(c, s.return_token_ids, s.logprobs or 0, chat_echo) if chat
                        else completion_choice(c, s) for c in ordered]
                body = (P.chat_body if chat else P.completion_body)(rid, st.model_name, created, made, use())
                if chat and s.prompt_logprobs is not None:  # vLLM: one list, on the response
                    body["prompt_logprobs"] = prompt_logprobs_json(ordered[0], s.prompt_logprobs)
            except P.APIError as e:
                status, body = e.status, e.body()
            resp = JSONResponse(body, status_code=status,
                                headers={"x-mla-replica": served_by} if served_by else None)
            st.metrics.observe_http(endpoint, status)
            await resp(request.scope, _no_receive, send)

        return Generation(st, produce, choices)

    async def produce(send):
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"), *replica_header]})
        st.metrics.observe_http(endpoint, 200)

        async def emit(obj):
            await send({"type": "http.response.body", "body": P.sse(obj), "more_body": True})

        try:
            if chat:
                for c in sorted(choices, key=lambda c: c.index):
                    await emit(P.chat_chunk(rid, st.model_name, created, [
                        {"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}]))
                    if chat_echo:  # vLLM sends the echoed message as the next chunk, before any token
                        await emit(P.chat_chunk(rid, st.model_name, created, [
                            {"index": c.index, "delta": {"content": chat_echo}, "logprobs": None,
                             "finish_reason": None}]))
            while not all(c.finished for c in choices):
                for ch, delta, new_ids, new_lps in await next_events(st, detok, q, by_id):
                    echo_text, echo_lps = ("", None) if chat else _echo_prefix(ch, s.logprobs)
                    if (not echo_text and not delta and not ch.finished and not (s.return_token_ids and new_ids)
                            and not (new_lps and s.logprobs is not None)):
                        continue
                    if chat:
                        d = chat_delta(ch, delta, new_ids, new_lps, s)
                        if d is not None:
                            await emit(P.chat_chunk(rid, st.model_name, created, [d]))
                    else:
                        offset = len(ch.echo_text or "") + ch.text_len - len(delta)
                        d = {"index": ch.index, "text": echo_text + delta,
                             "logprobs": _joined(echo_lps, completion_logprobs(new_ids, new_lps, offset)),
                             "finish_reason": ch.finish_reason}
                        if s.return_token_ids:
                            d["token_ids"] = new_ids
                        await emit(P.completion_body(rid, st.model_name, created, [d], None))
            if s.include_usage:
                maker = P.chat_chunk if chat else P.completion_body
                await emit(maker(rid, st.model_name, created, [], use()))
        except P.APIError as e:
            await emit(e.body())
        await send({"type": "http.response.body", "body": P.SSE_DONE, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return Generation(st, produce, choices)


async def _no_receive():  # a finished JSON response never reads the request again
    return {"type": "http.disconnect"}
