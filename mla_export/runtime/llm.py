"""`LLM`: offline batch generation over an `LLMEngine` (vLLM's `LLM.generate` shape)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .engine import LLMEngine
from .sampling import SamplingParams

__all__ = ["LLM", "CompletionOutput"]


@dataclass
class CompletionOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str | None


class LLM:
    def __init__(self, out_dir: str | Path, **engine_kwargs):
        self.engine = LLMEngine(out_dir, **engine_kwargs)
        self._ids = itertools.count()
        self._prompter = None  # the chat template, loaded on the first chat()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = -1,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """`prompts`: one prompt or a list of them, each a string or a list of token ids.
        `sampling_params` (one for all, or one per prompt) overrides the keyword arguments."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams(max_tokens, temperature, top_p, top_k, seed, tuple(stop_token_ids), ignore_eos)
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")

        # Only the final outputs are read: no per-step copies of growing outputs.
        sampling_params = [dataclasses.replace(sp, output_kind="final_only") for sp in sampling_params]
        ids = [f"llm-{next(self._ids)}" for _ in prompts]
        try:
            for rid, prompt, params in zip(ids, prompts, sampling_params):
                self.engine.add_request(rid, prompt, params)
            final = {}
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        final[out.request_id] = out
        finally:  # an error (or Ctrl-C) must not leave requests holding blocks
            for rid in ids:
                self.engine.abort_request(rid)
        return [
            CompletionOutput(final[r].prompt_token_ids, final[r].token_ids, final[r].text, final[r].finish_reason)
            for r in ids
        ]

    def chat(
        self,
        messages,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        **generate_kwargs,
    ) -> list[CompletionOutput]:
        """vLLM's `LLM.chat`: `messages` is one conversation (a list of {"role", "content"}
        dicts) or a list of them; each is rendered with the export's chat template (or
        `chat_template`: a file or the template text) and generated from. Other keyword
        arguments are `generate`'s (max_tokens, temperature, ...)."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("messages must be a conversation (a list of message dicts) or a list of conversations")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        if self._prompter is None or chat_template is not None:
            from .chat_prompt import ChatPrompter

            prompter = ChatPrompter(self.engine, chat_template)
            if chat_template is None:
                self._prompter = prompter
        else:
            prompter = self._prompter
        prompts = [prompter.prompt_ids(c, add_generation_prompt) for c in conversations]
        return self.generate(prompts, sampling_params=sampling_params, **generate_kwargs)
