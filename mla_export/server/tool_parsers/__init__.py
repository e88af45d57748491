"""Tool-call parsers by vLLM's `--tool-call-parser` names: each reads one model family's tool-call
markup out of generated text (base.py says how, streamed and not)."""

from __future__ import annotations

from .base import Call, CallDelta, CallTracker, Malformed, Parsed, ToolParser, ToolStream, calls_of
from .deepseek_v3 import DeepSeekV3ToolParser
from .deepseek_v31 import DeepSeekV31ToolParser
from .glm45 import Glm45ToolParser
from .hermes import HermesToolParser
from .kimi_k2 import KimiK2ToolParser

__all__ = ["Call", "CallDelta", "CallTracker", "Malformed", "Parsed", "ToolParser", "ToolStream", "calls_of",
           "TOOL_PARSERS", "tool_parser_class"]

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (DeepSeekV3ToolParser, DeepSeekV31ToolParser, KimiK2ToolParser, Glm45ToolParser,
                        HermesToolParser)
}


def tool_parser_class(name: str) -> type[ToolParser]:
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; one of {sorted(TOOL_PARSERS)}") from None
