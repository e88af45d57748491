"""The OpenAI-compatible HTTP app (Starlette): module-level route handlers over a `ServerState`.

    app = create_app(engine, model_name="tiny", api_key=None, max_num_seqs=64, max_queue=256)
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/completions, POST /v1/chat/completions (when a chat template exists),
GET /v1/models, GET /health, GET /metrics, and vLLM's POST /tokenize, POST /detokenize,
GET /version (routes_tokenize.py). Every handler reads the state from `request.app.state.server`;
the engine behind it is an `EngineClient` (engine_client.py): `create_app` puts an `LLMEngine`
in an `EngineLoop` thread of this process; `build_app(state)` serves any client (the Ray Serve
ingress passes the client of its engine replicas, mla_export/server/ray_serve/). The client
starts with the app's lifespan and stops (aborting what is left) when the app shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from . import chat_tools
from . import protocol as P
from ..runtime.chat_template import TemplateError
from .engine_client import ModelView
from .engine_loop import EngineLoop
from .generation import _Choice, _Detok, respond  # noqa: F401  (_Choice, _Detok: unit tests import them here)
from .metrics import CONTENT_TYPE, ServerMetrics
from .routes_tokenize import tokenize_routes
from .state import ServerState
from .stats_log import run_stats_log

__all__ = ["create_app", "build_app", "ServerState"]

log = logging.getLogger("mla_export.server")
MAX_BODY_BYTES = 16 << 20  # a prompt is at most the context length: far below this


# ---- request checks -------------------------------------------------------------------------

def check_auth(st: ServerState, request: Request) -> None:
    if st.api_key is None:
        return
    h = request.headers.get("authorization", "")
    scheme, _, token = h.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), st.api_key.encode()):
        st.metrics.observe_rejected("unauthorized")
        raise P.APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                         code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def check_model(st: ServerState, model: str | None) -> None:
    if model is not None and model != st.model_name:
        raise P.APIError(404, f"The model '{model}' does not exist; this server serves '{st.model_name}'.",
                         param="model", code="model_not_found")


async def read_body(st: ServerState, request: Request) -> dict:
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


async def to_ids(st: ServerState, prompt, truncating: bool = False) -> list[int]:
    if isinstance(prompt, list):
        if st.vocab_size is not None and max(prompt) >= int(st.vocab_size):
            raise P.bad_request(f"'prompt' token id {max(prompt)} is out of the vocabulary (size {st.vocab_size})", "prompt")
        return prompt
    if st.tokenizer is None:
        raise P.bad_request("this model has no tokenizer: send the prompt as token ids", "prompt")
    return await st.encode(prompt, special=True, truncating=truncating)


def truncated(st: ServerState, ids: list[int], s: P.Sampling) -> list[int]:
    """vLLM's truncate_prompt_tokens: the prompt's last k tokens (-1: the model's context)."""
    k = s.truncate_prompt_tokens
    if k is None:
        return ids
    if k == -1:
        k = st.max_model_len or len(ids)
    return ids[-k:]


def _error(e: P.APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _guarded(request: Request, endpoint: str, build) -> Response:
    st: ServerState = request.app.state.server
    try:
        if st.client.stopping or st.draining:
            raise P.APIError(503, "The server is shutting down.", type="server_error", code="shutting_down")
        check_auth(st, request)
        body = await read_body(st, request)
        return await build(st, body)
    except P.APIError as e:
        if e.status == 400:
            st.metrics.observe_rejected("bad_request")
        st.metrics.observe_http(endpoint, e.status)
        return _error(e)


# ---- routes ---------------------------------------------------------------------------------

async def completions(request: Request) -> Response:
    async def build(st, body):
        req = P.parse_completion_request(body, st.sampling_defaults)
        check_model(st, req.model)
        cut = req.sampling.truncate_prompt_tokens is not None
        ids = [truncated(st, await to_ids(st, p, cut), req.sampling) for p in req.prompts]
        echo = None
        if req.sampling.echo:  # the prompt as given, or the decode of given token ids
            echo = [p if isinstance(p, str) and req.sampling.truncate_prompt_tokens is None
                    else (st.decode(i) if st.tokenizer is not None else "") for p, i in zip(req.prompts, ids)]
        return await respond(st, request, "/v1/completions", ids, req.sampling, chat=False, echo_texts=echo)

    return await _guarded(request, "/v1/completions", build)


async def chat_completions(request: Request) -> Response:
    async def build(st, body):
        if st.chat_template is None:
            raise P.APIError(404, "This model has no chat template: use /v1/completions (or start the server "
                                  "with --chat-template).", code="no_chat_template")
        if st.tokenizer is None:
            raise P.APIError(404, "This model has no tokenizer: chat needs one.", code="no_tokenizer")
        req = P.parse_chat_request(body, st.sampling_defaults)
        check_model(st, req.model)
        chat = chat_tools.plan(st, req)  # tools / tool_choice against the server's parsers
        try:
            text = st.chat_template.render(req.messages, **chat.template_args())
        except TemplateError as e:
            raise P.bad_request(f"the chat template rejected the request: {e}", e.param) from None
        ids = truncated(st, await st.encode(text, special=False,
                                            truncating=req.sampling.truncate_prompt_tokens is not None), req.sampling)
        if not ids:
            raise P.bad_request("the rendered chat prompt is empty", "messages")
        output = chat.output(text)
        return await respond(st, request, "/v1/chat/completions", [ids], req.sampling, chat=True,
                             chat_output=output, decode=chat.decode, chat_echo=req.echo_text)

    return await _guarded(request, "/v1/chat/completions", build)


async def models(request: Request) -> Response:
    st: ServerState = request.app.state.server
    try:
        check_auth(st, request)
    except P.APIError as e:
        return _error(e)
    card = {"id": st.model_name, "object": "model", "created": st.created, "owned_by": "mla-export",
            "max_model_len": st.max_model_len, "chat": st.chat_template is not None}
    return JSONResponse({"object": "list", "data": [card]})


async def health(request: Request) -> Response:
    st: ServerState = request.app.state.server
    c = st.client
    if c.alive and not c.stopping and not st.draining:
        return JSONResponse({"status": "ok"})
    reason = "shutting down" if c.stopping or st.draining else (c.dead_reason or "engine loop not running")
    return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)


async def metrics(request: Request) -> Response:
    st: ServerState = request.app.state.server
    text = st.metrics.render(st.client.stats(), model=st.model_name, healthy=st.client.alive,
                             replicas=st.client.replica_stats())
    return PlainTextResponse(text, media_type=CONTENT_TYPE)


async def http_error(request: Request, exc: HTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return JSONResponse(P.error_body(str(exc.detail), code=code), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
    """A client that hangs up before its body is complete: nothing to answer, and not a server fault."""
    log.info("client disconnected before sending its whole request body: %s %s", request.method, request.url.path)
    return Response(status_code=400)  # nobody reads it; uvicorn drops it on the closed connection


async def server_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    return JSONResponse(P.error_body("Internal server error.", type="server_error"), status_code=500)


# ---- the app --------------------------------------------------------------------------------

def build_app(st: ServerState) -> Starlette:
    """The app over a ready state; its lifespan starts and stops `st.client`."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await asyncio.to_thread(st.client.start)
        await asyncio.to_thread(st.encoder.start)
        log.info("engine client started: capacity %d sequences", st.client.capacity)
        stats_task = None
        if st.log_stats_interval:
            stats_task = asyncio.ensure_future(run_stats_log(st.metrics, st.client, st.log_stats_interval))
        try:
            yield
        finally:
            if stats_task is not None:
                stats_task.cancel()
            st.encoder.close()
            stats = await asyncio.to_thread(st.client.stop, 60.0)
            st.final_stats = stats
            log.info("engine client stopped: kv_blocks_used=%s of %s, running=%s, waiting=%s",
                     stats.get("kv_blocks_used"), stats.get("kv_blocks_total"),
                     stats.get("num_running"), stats.get("num_waiting"))

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *tokenize_routes(st, check_auth=functools.partial(check_auth, st), check_model=functools.partial(check_model, st),
                         read_body=functools.partial(read_body, st)),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, ClientDisconnect: client_gone,
                                        Exception: server_error})
    app.state.server = st
    return app


def create_app(engine, *, model_name: str, api_key: str | None = None, max_num_seqs: int = 64,
               max_queue: int = 256, chat_template: str | None = None, generation_config: str = "auto",
               log_requests: bool = False, log_stats_interval: float | None = None, **parsers) -> Starlette:
    """`engine` is an `LLMEngine` that this app owns from startup to shutdown: its loop thread
    starts with the app's lifespan and stops (aborting what is left) when the app shuts down.
    `log_requests`: a line per sequence received / finished / aborted (never the prompt);
    `log_stats_interval`: seconds between vLLM's stats lines (None: none); `parsers`: ServerState's
    tool_call_parser, enable_auto_tool_choice, reasoning_parser."""
    m = ServerMetrics(model_name=model_name, max_model_len=engine.max_model_len)
    m.set_cache_config(cache_config_info(engine))
    loop = EngineLoop(engine, max_num_seqs=max_num_seqs, max_queue=max_queue, metrics=m, log_requests=log_requests)
    st = ServerState(loop, ModelView.of_engine(engine), m, model_name=model_name, api_key=api_key,
                     chat_template=chat_template, generation_config=generation_config, **parsers)
    st.log_stats_interval = log_stats_interval
    return build_app(st)


def cache_config_info(engine) -> dict:
    """vllm:cache_config_info's labels for this engine (vLLM's CacheConfig field names; the CPU
    cache's blocks are what vLLM calls num_gpu_blocks)."""
    kv = engine.kv_cache
    return {"block_size": kv.block_size, "cache_dtype": engine.facts.cache_dtype,
            "enable_prefix_caching": bool(kv.enable_prefix_caching), "num_gpu_blocks": kv.num_blocks, "engine": 0}
