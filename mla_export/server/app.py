"""The OpenAI-compatible HTTP app (Starlette) around one `LLMEngine`.

    app = create_app(engine, model_name="tiny", api_key=None, max_num_seqs=64, max_queue=256)
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/completions, POST /v1/chat/completions (when a chat template exists),
GET /v1/models, GET /health, GET /metrics, and vLLM's POST /tokenize, POST /detokenize,
GET /version (routes_tokenize.py). The engine runs in the `EngineLoop` thread, started
and stopped by the app's lifespan; every request is an engine request (n choices: n engine
requests sharing the prompt's prefix-cached blocks).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from . import protocol as P
from .chat import ChatTemplate, TemplateError, load_chat_template
from .tokenize import PromptEncoder, PromptTooLong
from .engine_loop import Aborted, EngineDead, EngineLoop, QueueFull, SeqRequest, ShuttingDown
from .metrics import CONTENT_TYPE, ServerMetrics
from .routes_tokenize import tokenize_routes

__all__ = ["create_app", "ServerState"]

log = logging.getLogger("mla_export.server")
MAX_BODY_BYTES = 16 << 20  # a prompt is at most the context length: far below this


# ---- engine facts ---------------------------------------------------------------------------

def _contract(engine) -> dict:
    """The contract's JSON (`mla_graph.json`) as a dict: a `Contract` object keeps it in `.raw`."""
    c = getattr(engine, "contract", None)
    if isinstance(c, dict):
        return c
    raw = getattr(c, "raw", None)
    return raw if isinstance(raw, dict) else {}


def _have_jinja2() -> bool:
    import importlib.util

    return importlib.util.find_spec("jinja2") is not None


def _token_str(tokenizer, token_id) -> str | None:
    if tokenizer is None or token_id is None:
        return None
    if isinstance(token_id, (list, tuple)):
        token_id = token_id[0] if token_id else None
        if token_id is None:
            return None
    try:
        return tokenizer.id_to_token(int(token_id))
    except Exception:
        return None


# ---- per-request choice state -----------------------------------------------------------------

@dataclass
class _Choice:
    index: int
    request_id: str
    stop: list[str]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""  # text emitted so far
    final_text: str | None = None  # the whole text, once finished
    finished: bool = False
    finish_reason: str | None = None
    last_sent_tokens: int = 0  # token ids already reported (return_token_ids in streams)


class _Detok:
    """Text of a choice's tokens, emitted incrementally: holds back an incomplete UTF-8
    character (U+FFFD at the end) and any tail that could still become a stop string; cuts the
    text at the first stop string."""

    def __init__(self, decode: Callable[[list[int]], str] | None):
        self.decode = decode

    def full_text(self, out) -> str:
        if out.text is not None:  # the engine's own decode of all generated tokens
            return out.text
        if self.decode is not None:
            return self.decode(list(out.token_ids))
        return ""

    def advance(self, ch: _Choice, out) -> tuple[str, bool]:
        """(new text to emit, whether a stop string ended the choice). When the choice ends,
        `ch.final_text` is its whole text (what a non-streamed response returns)."""
        full = self.full_text(out)
        if ch.stop:
            longest = max(len(s) for s in ch.stop)
            start = max(0, len(ch.text) - longest + 1)
            hits = [i for s in ch.stop if (i := full.find(s, start)) >= 0]
            if hits:
                ch.final_text = full[:min(hits)]
                return _suffix_after(ch.final_text, ch.text), True
        if out.finished:
            ch.final_text = full
            return _suffix_after(full, ch.text), False
        end = len(full)
        while end > 0 and full[end - 1] == "\ufffd":  # maybe an incomplete UTF-8 sequence so far
            end -= 1
        hold = 0
        for s in ch.stop:  # a tail that may still grow into a stop string stays back
            for k in range(min(len(s) - 1, end), 0, -1):
                if full[end - k:end] == s[:k]:
                    hold = max(hold, k)
                    break
        end -= hold
        if end <= len(ch.text):
            return "", False
        return _suffix_after(full[:end], ch.text), False


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


# ---- the app --------------------------------------------------------------------------------

class ServerState:
    """What the routes share: the engine loop, the tokenizer, the template, the settings."""

    def __init__(self, engine, *, model_name: str, api_key: str | None, max_num_seqs: int, max_queue: int,
                 chat_template: str | None = None):
        self.engine = engine
        self.model_name = model_name
        self.api_key = api_key
        self.metrics = ServerMetrics(model_name=model_name)
        self.loop = EngineLoop(engine, max_num_seqs=max_num_seqs, max_queue=max_queue, metrics=self.metrics)
        self.tokenizer = getattr(engine, "tokenizer", None)
        self.max_model_len = getattr(engine, "max_model_len", None)
        tok_path = getattr(getattr(engine, "facts", None), "tokenizer_path", None)
        self.encoder = PromptEncoder(self.tokenizer, str(tok_path) if tok_path else None, self.max_model_len)
        contract = _contract(engine)
        facts = contract.get("model", {})
        self.vocab_size = facts.get("vocab_size")
        self.created = int(time.time())
        self.final_stats: dict | None = None
        out_dir = getattr(getattr(engine, "facts", None), "out_dir", None) or getattr(
            getattr(engine, "contract", None), "out_dir", None)
        tmpl_src = load_chat_template(out_dir, contract.get("chat_template"), chat_template)
        self.chat_template: ChatTemplate | None = None
        if tmpl_src is not None and not _have_jinja2():
            log.warning("the model has a chat template but jinja2 is not installed: /v1/chat/completions is off")
            tmpl_src = None
        if tmpl_src is not None:
            tok = contract.get("tokenizer") or {}
            eos_ids = facts.get("eos_token_ids") or facts.get("eos_token_id")
            self.chat_template = ChatTemplate(
                tmpl_src,
                bos_token=tok.get("bos_token") or _token_str(self.tokenizer, facts.get("bos_token_id")),
                eos_token=tok.get("eos_token") or _token_str(self.tokenizer, eos_ids))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def encode(self, text: str, *, special: bool) -> list[int]:
        """Token ids, tokenized off the event loop when the text is long (see tokenize.py)."""
        try:
            return await self.encoder.encode(text, special=special, max_tokens=self.max_model_len)
        except PromptTooLong as e:
            raise P.bad_request(f"This model's maximum context length is {self.max_model_len} tokens; {e}.",
                                "prompt", "context_length_exceeded") from None


def _error(e: P.APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(engine, *, model_name: str, api_key: str | None = None, max_num_seqs: int = 64,
               max_queue: int = 256, chat_template: str | None = None) -> Starlette:
    """`engine` is an `LLMEngine` that this app owns from startup to shutdown: its loop thread
    starts with the app's lifespan and stops (aborting what is left) when the app shuts down."""
    st = ServerState(engine, model_name=model_name, api_key=api_key, max_num_seqs=max_num_seqs,
                     max_queue=max_queue, chat_template=chat_template)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        st.loop.start()
        await asyncio.to_thread(st.encoder.start)
        log.info("engine loop started: capacity %d sequences", st.loop.capacity)
        try:
            yield
        finally:
            st.encoder.close()
            stats = await asyncio.to_thread(st.loop.stop, 60.0)
            st.final_stats = stats
            log.info("engine loop stopped: kv_blocks_used=%s of %s, running=%s, waiting=%s",
                     stats.get("kv_blocks_used"), stats.get("kv_blocks_total"),
                     stats.get("num_running"), stats.get("num_waiting"))

    def check_auth(request: Request) -> None:
        if st.api_key is None:
            return
        h = request.headers.get("authorization", "")
        scheme, _, token = h.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), st.api_key.encode()):
            st.metrics.observe_rejected("unauthorized")
            raise P.APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                             code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def check_model(model: str | None) -> None:
        if model is not None and model != st.model_name:
            raise P.APIError(404, f"The model '{model}' does not exist; this server serves '{st.model_name}'.",
                             param="model", code="model_not_found")

    async def read_body(request: Request) -> dict:
        too_big = P.APIError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.", code="body_too_large")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise too_big
        body = bytearray()  # grown as chunks arrive: no 16 MiB join at the end
        async for chunk in request.stream():
            if len(body) + len(chunk) > MAX_BODY_BYTES:
                raise too_big
            body += chunk
        return await st.encoder.parse_json(body)  # big bodies are parsed off the event loop

    async def to_ids(prompt) -> list[int]:
        if isinstance(prompt, list):
            if st.vocab_size is not None and max(prompt) >= int(st.vocab_size):
                raise P.bad_request(f"'prompt' token id {max(prompt)} is out of the vocabulary (size {st.vocab_size})", "prompt")
            return prompt
        if st.tokenizer is None:
            raise P.bad_request("this model has no tokenizer: send the prompt as token ids", "prompt")
        return await st.encode(prompt, special=True)

    def engine_params(s: P.Sampling, prompt_len: int, choice: int):
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
        seed = None if s.seed is None else (s.seed + choice) % 2**63
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                  seed=seed, stop_token_ids=tuple(s.stop_token_ids), ignore_eos=s.ignore_eos)
        except ValueError as e:
            raise P.bad_request(str(e)) from None

    async def start(prompt_ids: list[list[int]], s: P.Sampling, prefix: str) -> tuple[asyncio.Queue, list[_Choice], list[int]]:
        if s.stop and st.tokenizer is None:
            raise P.bad_request("stop strings need a tokenizer; this model has none (use token ids)", "stop")
        seqs, choices = [], []
        for p, ids in enumerate(prompt_ids):
            for i in range(s.n):
                idx = p * s.n + i
                rid = f"{prefix}-{idx}"
                seqs.append(SeqRequest(rid, ids, engine_params(s, len(ids), i)))
                choices.append(_Choice(index=idx, request_id=rid, stop=list(s.stop)))
        try:
            q = await st.loop.submit(seqs)
        except QueueFull:
            st.metrics.observe_rejected("queue_full")
            raise P.APIError(429, f"The server is at capacity ({st.loop.capacity} sequences running or queued); "
                                  "retry later.", type="rate_limit_error", code="queue_full",
                             headers={"Retry-After": "1"}) from None
        except ShuttingDown:
            raise P.APIError(503, "The server is shutting down.", type="server_error", code="shutting_down") from None
        except EngineDead as e:
            raise P.APIError(503, f"The engine failed: {e}", type="server_error", code="engine_error") from None
        except ValueError as e:  # the engine's own validation (context, cache capacity, ...)
            raise P.bad_request(str(e)) from None
        return q, choices, [len(x) for x in prompt_ids]

    # ---- generation: one ASGI response that races the work against a client disconnect ----
    class _Generation(Response):
        def __init__(self, produce, choices: list[_Choice], status_code: int = 200):
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
                st.loop.abort([c.request_id for c in self.choices if not c.finished])
            if work.done() and not work.cancelled() and work.exception() is not None:
                exc = work.exception()
                if not isinstance(exc, OSError):
                    log.error("generation failed", exc_info=exc)

    detok = _Detok(st.decode if st.tokenizer is not None else None)

    async def next_events(q: asyncio.Queue, by_id: dict[str, _Choice]):
        """Wait for engine outputs; yields (choice, new_text, new_token_ids) per update and
        raises APIError on a server-side abort."""
        item = await q.get()
        items = [item]
        while not q.empty():
            items.append(q.get_nowait())
        events = []
        for item in items:
            ch = by_id.get(item.request_id)
            if ch is None or ch.finished:
                continue
            if isinstance(item, Aborted):
                ch.finished = True
                ch.finish_reason = "abort"
                if item.reason == "shutdown":
                    raise P.APIError(503, "The server shut down before the request finished.", type="server_error",
                                     code="shutting_down")
                raise P.APIError(500, f"The engine failed: {item.error}", type="server_error", code="engine_error")
            delta, stopped = detok.advance(ch, item)
            new_ids = list(item.token_ids[ch.last_sent_tokens:])
            ch.token_ids = list(item.token_ids)
            ch.last_sent_tokens = len(ch.token_ids)
            ch.text += delta
            if stopped:
                ch.finished = True
                ch.finish_reason = "stop"
                if not item.finished:
                    st.loop.abort([ch.request_id], reason="stop")
            elif item.finished:
                ch.finished = True
                ch.finish_reason = item.finish_reason or "stop"
            events.append((ch, delta, new_ids))
        return events

    def completion_choice(ch: _Choice, want_ids: bool) -> dict:
        d = {"index": ch.index, "text": _text(ch), "logprobs": None, "finish_reason": ch.finish_reason}
        if want_ids:
            d["token_ids"] = ch.token_ids
        return d

    def chat_choice(ch: _Choice, want_ids: bool) -> dict:
        d = {"index": ch.index, "message": {"role": "assistant", "content": _text(ch)}, "logprobs": None,
             "finish_reason": ch.finish_reason}
        if want_ids:
            d["token_ids"] = ch.token_ids
        return d

    async def respond(request: Request, endpoint: str, prompt_ids: list[list[int]], s: P.Sampling, chat: bool):
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        created = P.now()
        q, choices, prompt_lens = await start(prompt_ids, s, rid)
        by_id = {c.request_id: c for c in choices}
        prompt_tokens = sum(prompt_lens)

        def use() -> dict:
            return P.usage(prompt_tokens, sum(len(c.token_ids) for c in choices))

        if not s.stream:
            async def produce(send):
                status, body = 200, None
                try:
                    while not all(c.finished for c in choices):
                        await next_events(q, by_id)
                    make = chat_choice if chat else completion_choice
                    ordered = sorted(choices, key=lambda c: c.index)
                    body = (P.chat_body if chat else P.completion_body)(
                        rid, st.model_name, created, [make(c, s.return_token_ids) for c in ordered], use())
                except P.APIError as e:
                    status, body = e.status, e.body()
                resp = JSONResponse(body, status_code=status)
                st.metrics.observe_http(endpoint, status)
                await resp(request.scope, _no_receive, send)

            return _Generation(produce, choices)

        async def produce(send):
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]})
            st.metrics.observe_http(endpoint, 200)

            async def emit(obj):
                await send({"type": "http.response.body", "body": P.sse(obj), "more_body": True})

            try:
                if chat:
                    for c in sorted(choices, key=lambda c: c.index):
                        await emit(P.chat_chunk(rid, st.model_name, created, [
                            {"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}]))
                while not all(c.finished for c in choices):
                    for ch, delta, new_ids in await next_events(q, by_id):
                        if not delta and not ch.finished and not (s.return_token_ids and new_ids):
                            continue
                        if chat:
                            d: dict[str, Any] = {"index": ch.index, "delta": {"content": delta} if delta else {},
                                                 "logprobs": None, "finish_reason": ch.finish_reason}
                            if s.return_token_ids:
                                d["token_ids"] = new_ids
                            await emit(P.chat_chunk(rid, st.model_name, created, [d]))
                        else:
                            d = {"index": ch.index, "text": delta, "logprobs": None, "finish_reason": ch.finish_reason}
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

        return _Generation(produce, choices)

    async def handle(request: Request, endpoint: str, build) -> Response:
        try:
            if st.loop.stopping:
                raise P.APIError(503, "The server is shutting down.", type="server_error", code="shutting_down")
            check_auth(request)
            body = await read_body(request)
            resp = await build(body)
            return resp
        except P.APIError as e:
            if e.status == 400:
                st.metrics.observe_rejected("bad_request")
            st.metrics.observe_http(endpoint, e.status)
            return _error(e)

    async def completions(request: Request) -> Response:
        async def build(body):
            req = P.parse_completion_request(body)
            check_model(req.model)
            ids = [await to_ids(p) for p in req.prompts]
            return await respond(request, "/v1/completions", ids, req.sampling, chat=False)

        return await handle(request, "/v1/completions", build)

    async def chat_completions(request: Request) -> Response:
        async def build(body):
            if st.chat_template is None:
                raise P.APIError(404, "This model has no chat template: use /v1/completions (or start the server "
                                      "with --chat-template).", code="no_chat_template")
            if st.tokenizer is None:
                raise P.APIError(404, "This model has no tokenizer: chat needs one.", code="no_tokenizer")
            req = P.parse_chat_request(body)
            check_model(req.model)
            try:
                text = st.chat_template.render(req.messages, add_generation_prompt=req.add_generation_prompt,
                                               **req.template_kwargs)
            except TemplateError as e:
                raise P.bad_request(f"the chat template rejected the messages: {e}", "messages") from None
            ids = await st.encode(text, special=False)
            if not ids:
                raise P.bad_request("the rendered chat prompt is empty", "messages")
            return await respond(request, "/v1/chat/completions", [ids], req.sampling, chat=True)

        return await handle(request, "/v1/chat/completions", build)

    async def models(request: Request) -> Response:
        try:
            check_auth(request)
        except P.APIError as e:
            return _error(e)
        card = {"id": st.model_name, "object": "model", "created": st.created, "owned_by": "mla-export",
                "max_model_len": st.max_model_len, "chat": st.chat_template is not None}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        if st.loop.alive and not st.loop.stopping:
            return JSONResponse({"status": "ok"})
        reason = "shutting down" if st.loop.stopping else (st.loop.dead_reason or "engine loop not running")
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)

    async def metrics(request: Request) -> Response:
        text = st.metrics.render(st.loop.stats(), model=st.model_name, healthy=st.loop.alive)
        return PlainTextResponse(text, media_type=CONTENT_TYPE)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(P.error_body(str(exc.detail), code=code), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("unhandled error", exc_info=exc)
        return JSONResponse(P.error_body("Internal server error.", type="server_error"), status_code=500)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *tokenize_routes(st, check_auth=check_auth, check_model=check_model, read_body=read_body),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.server = st
    return app


async def _no_receive():  # a finished JSON response never reads the request again
    return {"type": "http.disconnect"}
