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
`ThinkSplitter.stream()` splits one output as it grows, fed each step's new text: while the text
grows a tail that may become a tag stays back, and a step only searches that tail plus the new
text (its work does not grow with the output). `split(text)` feeds a whole text at once (the
non-streamed answer), so a stream's pieces add up to it however the text was cut.
"""

from __future__ import annotations

from .tool_parsers.base import held_back

__all__ = ["REASONING_PARSERS", "ThinkSplitter", "ThinkStream", "reasoning_splitter", "check_reasoning_parser"]

START, END = "<think>", "</think>"
REASONING_PARSERS = ("deepseek_r1", "deepseek_v3", "glm45", "kimi_k2", "qwen3")


class ThinkSplitter:
    """A request's rule (shared by its choices); `stream()` is one choice's split."""

    tokens = (START, END)

    def __init__(self, opens: bool):
        self.opens = opens  # the output starts inside the thinking

    def stream(self) -> "ThinkStream":
        return ThinkStream(self.opens)

    def split(self, text: str) -> tuple[str, str | None]:
        """(thinking, answer) of a finished output: the answer is None when the thinking never
        ended (without thinking at all, the thinking is "" and the answer the whole text)."""
        return self.stream().feed(text, True)


_HEAD, _THINK, _ANSWER = "head", "think", "answer"


class ThinkStream:
    def __init__(self, opens: bool):
        self.opens = opens
        self._state = _HEAD  # the text so far may still be the opening tag
        self._held = ""  # _HEAD: the text so far (a start of START); _THINK: a tail that may become END

    def feed(self, piece: str, final: bool) -> tuple[str, str | None]:
        """(thinking it adds, answer it adds): the answer is None until the thinking has ended;
        `final`: the output ends with this piece (nothing is held back)."""
        if self._state == _HEAD:
            text, self._held = self._held + piece, ""
            if text.startswith(START):
                self._state, piece = _THINK, text[len(START):]  # an opening tag is dropped
            elif not final and START.startswith(text):
                self._held = text  # maybe the opening tag: wait
                return "", None
            elif self.opens:
                self._state, piece = _THINK, text
            else:
                self._state = _ANSWER  # no thinking: all of the output is the answer
                return "", text
        if self._state == _THINK:
            body = self._held + piece
            e = body.find(END)
            if e >= 0:
                self._state, self._held = _ANSWER, ""
                return body[:e], body[e + len(END):]
            keep = 0 if final else held_back(body, END)
            self._held = body[len(body) - keep:] if keep else ""
            return body[:len(body) - keep], None
        return "", piece


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
