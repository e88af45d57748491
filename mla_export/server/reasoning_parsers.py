"""Reasoning parsers by vLLM's `--reasoning-parser` names: split generated text into the
model's thinking (`<think> ... </think>`) and the answer after it.

Where the thinking starts depends on the chat template, so each parser is made per request
from the rendered prompt and the request's chat_template_kwargs:
- deepseek_r1: the output is thinking up to `</think>` (R1's templates end the prompt with
  `<think>`, so the output usually has no opening tag; one is dropped if it comes). An output
  without `</think>` is all thinking (as vLLM does).
- deepseek_v3: DeepSeek-V3.1's hybrid thinking: as deepseek_r1 when chat_template_kwargs has
  `thinking` (or `enable_thinking`) true, else no thinking (vLLM's rule).
- qwen3, glm45, kimi_k2: thinking when the prompt ends with `<think>` (the template opened it)
  or the output starts with `<think>`; none when the prompt ends with `</think>` (thinking off).
The split is a function of the text so far: while the text grows a tail that may become a tag
stays back, so a stream is the difference of consecutive splits and the last split is the
non-streamed answer.
"""

from __future__ import annotations

from .tool_parsers.base import held_back

__all__ = ["REASONING_PARSERS", "ThinkSplitter", "reasoning_splitter", "check_reasoning_parser"]

START, END = "<think>", "</think>"
REASONING_PARSERS = ("deepseek_r1", "deepseek_v3", "glm45", "kimi_k2", "qwen3")


class ThinkSplitter:
    tokens = (START, END)

    def __init__(self, opens: bool):
        self.opens = opens  # the output starts inside the thinking

    def split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        """(thinking so far, answer so far): the answer is None until the thinking has ended."""
        if text.startswith(START):
            body = text[len(START):]
        elif not final and START.startswith(text):
            return None, None  # maybe the opening tag: wait
        elif self.opens:
            body = text
        else:
            return None, text
        e = body.find(END)
        if e >= 0:
            return body[:e], body[e + len(END):]
        if not final:
            body = body[:len(body) - held_back(body, END)]
        return body, None


def check_reasoning_parser(name: str | None) -> None:
    if name is not None and name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; one of {list(REASONING_PARSERS)}")


def reasoning_splitter(name: str | None, prompt: str, template_kwargs: dict) -> ThinkSplitter | None:
    """The request's splitter, or None when there is no thinking to split out."""
    if name is None:
        return None
    if name == "deepseek_r1":
        return ThinkSplitter(opens=True)
    if name == "deepseek_v3":
        on = template_kwargs.get("thinking", template_kwargs.get("enable_thinking", False))
        return ThinkSplitter(opens=True) if on else None
    tail = prompt.rstrip()
    if tail.endswith(END):
        return None
    return ThinkSplitter(opens=tail.endswith(START))
