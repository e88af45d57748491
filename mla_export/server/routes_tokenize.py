"""`POST /tokenize`, `POST /detokenize`, `GET /version` in vLLM's shapes.

    /tokenize    {"prompt": str, "add_special_tokens": true, "return_token_strs": false}
                 or {"messages": [...], "add_generation_prompt": true, "add_special_tokens": false, ...}
                 -> {"count": n, "max_model_len": L, "tokens": [ids], "token_strs": [str] | null}
    /detokenize  {"tokens": [ids]} -> {"prompt": str}   (special tokens kept, as vLLM does)
    /version     -> {"version": "<mla-export version>"}

A chat body is rendered with the server's chat template exactly as /v1/chat/completions
renders it, so the count is the prompt's length there. Tokenizing runs in a worker thread
(a long prompt must not hold up the event loop that streams other requests).
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import protocol as P
from ..runtime.chat_template import TemplateError
from .chat_tools import template_args

__all__ = ["tokenize_routes"]

_CHAT_KEYS = ("model", "messages", "add_generation_prompt", "chat_template_kwargs", "tools")


def tokenize_routes(st, *, check_auth, check_model, read_body) -> list[Route]:
    """The three routes over the app's `ServerState` and its request checks."""

    async def guarded(request: Request, endpoint: str, build) -> Response:
        try:
            check_auth(request)
            resp = await build()
        except P.APIError as e:
            st.metrics.observe_http(endpoint, e.status)
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        st.metrics.observe_http(endpoint, 200)
        return resp

    def need_tokenizer():
        if st.tokenizer is None:
            raise P.APIError(404, "This model has no tokenizer.", code="no_tokenizer")

    async def tokenize(request: Request) -> Response:
        async def build():
            body = await read_body(request)
            check_model(P._get_str(body, "model", None))
            need_tokenizer()
            want_strs = P._get_bool(body, "return_token_strs", False)
            if "messages" in body:
                if st.chat_template is None:
                    raise P.APIError(404, "This model has no chat template: tokenize a 'prompt' instead.",
                                     code="no_chat_template")
                req = P.parse_chat_request({k: body[k] for k in _CHAT_KEYS if k in body})
                special = P._get_bool(body, "add_special_tokens", False)  # the template writes them
                try:
                    text = st.chat_template.render(req.messages, **template_args(req))
                except TemplateError as e:
                    raise P.bad_request(f"the chat template rejected the request: {e}", e.param) from None
            else:
                text = body.get("prompt")
                if not isinstance(text, str):
                    raise P.bad_request("'prompt' must be a string (or send 'messages')", "prompt")
                special = P._get_bool(body, "add_special_tokens", True)
            enc = await asyncio.to_thread(st.tokenizer.encode, text, add_special_tokens=special)
            ids = list(enc.ids)
            return JSONResponse({"count": len(ids), "max_model_len": st.max_model_len, "tokens": ids,
                                 "token_strs": list(enc.tokens) if want_strs else None})

        return await guarded(request, "/tokenize", build)

    async def detokenize(request: Request) -> Response:
        async def build():
            body = await read_body(request)
            check_model(P._get_str(body, "model", None))
            need_tokenizer()
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise P.bad_request("'tokens' must be an array of integer token ids", "tokens")
            vocab = st.vocab_size if st.vocab_size is not None else st.tokenizer.get_vocab_size()
            bad = [t for t in ids if not 0 <= t < int(vocab)]
            if bad:
                raise P.bad_request(f"'tokens' holds id {bad[0]}, outside the vocabulary [0, {vocab})", "tokens")
            text = await asyncio.to_thread(st.tokenizer.decode, ids, skip_special_tokens=False)
            return JSONResponse({"prompt": text})

        return await guarded(request, "/detokenize", build)

    async def version(request: Request) -> Response:
        from ..version import __version__

        return JSONResponse({"version": __version__})

    return [
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/version", version, methods=["GET"]),
    ]
