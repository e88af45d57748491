"""`ServerState`: what every route handler shares (app.state.server).

The engine client (in-process `EngineLoop` or the Ray replicas' client), the model view
(tokenizer, context length, contract), the chat template, the settings and the metrics. One
state type for both hosts, so the handlers do not know where the engine runs.
"""

from __future__ import annotations

import importlib.util
import logging
import time

from . import protocol as P
from ..runtime.chat_template import ChatTemplate, load_chat_template
from .engine_client import EngineClient, ModelView
from .metrics import ServerMetrics
from .chat_tools import marker_decoder
from .reasoning_parsers import check_reasoning_parser
from .tool_parsers import tool_parser_class
from .tokenize import PromptEncoder, PromptTooLong

__all__ = ["ServerState"]

log = logging.getLogger("mla_export.server")


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


class ServerState:
    def __init__(self, client: EngineClient, model: ModelView, metrics: ServerMetrics, *, model_name: str,
                 api_key: str | None, chat_template: str | None = None, generation_config: str = "auto",
                 tool_call_parser: str | None = None, enable_auto_tool_choice: bool = False,
                 reasoning_parser: str | None = None):
        # vLLM's --tool-call-parser / --enable-auto-tool-choice / --reasoning-parser (chat_tools.py)
        if enable_auto_tool_choice and tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
        self.tool_parser_cls = tool_parser_class(tool_call_parser) if tool_call_parser else None
        self.enable_auto_tool_choice = enable_auto_tool_choice
        check_reasoning_parser(reasoning_parser)
        self.reasoning_parser = reasoning_parser
        self._decoders: dict = {}
        self.client = client
        self.model_name = model_name
        self.api_key = api_key
        self.metrics = metrics
        self.tokenizer = model.tokenizer
        self.max_model_len = model.max_model_len
        self.encoder = PromptEncoder(self.tokenizer, str(model.tokenizer_path) if model.tokenizer_path else None,
                                     self.max_model_len)
        contract, facts = model.contract, model.facts
        self.vocab_size = facts.get("vocab_size")
        self.created = int(time.time())
        self.final_stats: dict | None = None
        # Set by `mla-export serve` on SIGTERM/SIGINT (draining.py): /health and new generation
        # requests answer 503 while the running ones finish.
        self.draining = False
        # vLLM's --generation-config: the model's recommended sampling values are the defaults of
        # requests that do not give them (max_new_tokens: of max_tokens).
        from ..runtime.generation_config import read_generation_defaults

        self.sampling_defaults = read_generation_defaults(generation_config, model.out_dir)
        self.log_stats_interval: float | None = None  # seconds between stats lines (stats_log.py); None: off
        tmpl_src = load_chat_template(model.out_dir, contract.get("chat_template"), chat_template)
        self.chat_template: ChatTemplate | None = None
        if tmpl_src is not None and importlib.util.find_spec("jinja2") is None:
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

    def decode_keeping(self, markers: tuple[str, ...]):
        """The decode of a request whose parsers need these marker tokens in the text, when the
        tokenizer calls them special (else None: the usual text keeps them)."""
        if markers not in self._decoders:
            self._decoders[markers] = marker_decoder(self.tokenizer, markers)
        return self._decoders[markers]

    async def encode(self, text: str, *, special: bool, truncating: bool = False) -> list[int]:
        """Token ids, tokenized off the event loop when the text is long (see tokenize.py).
        `truncating`: the caller keeps only the last tokens (more than the context may come back,
        within the character limit)."""
        try:
            return await self.encoder.encode(text, special=special, max_tokens=None if truncating else self.max_model_len)
        except PromptTooLong as e:
            raise P.bad_request(f"This model's maximum context length is {self.max_model_len} tokens; {e}.",
                                "prompt", "context_length_exceeded") from None
