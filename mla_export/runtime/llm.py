"""`LLM`: offline batch generation over an `LLMEngine` (vLLM's `LLM.generate` shape)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

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
    def __init__(self, out_dir: str | Path | None = None, *, engine: LLMEngine | None = None, **engine_kwargs):
        """`LLM(out_dir, **engine_kwargs)` builds its engine; `LLM(engine=engine)` generates over an
        engine that already exists (one compiled model serving several front ends, or tests)."""
        if engine is not None:
            if out_dir is not None or engine_kwargs:
                raise ValueError("give either an existing engine or out_dir and engine options, not both")
            if not isinstance(engine, LLMEngine):
                raise TypeError(f"engine must be an LLMEngine, got {type(engine).__name__}")
            self.engine = engine
        elif out_dir is None:
            raise ValueError("LLM needs out_dir (an `mla-export export` output directory) or engine=")
        else:
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
        prompts = _prompt_list(prompts)
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
        for i, r in enumerate(ids):
            if final[r].finish_reason == "error":
                raise RuntimeError(f"prompt {i} failed: {final[r].error}")
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

def _is_token_id(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _prompt_list(prompts) -> list:
    """One prompt (a string, a flat sequence or 1-D numpy array of token ids) or several (a list
    of those, or a 2-D numpy array, one prompt per row) -> a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, np.ndarray):
        if prompts.ndim == 1:
            return [prompts]
        if prompts.ndim == 2:
            return list(prompts)
        raise ValueError(f"a numpy array of prompts must be 1-D (one prompt) or 2-D (one per row), got shape "
                         f"{prompts.shape}")
    try:
        prompts = list(prompts)
    except TypeError:
        raise TypeError(f"prompts must be a string, token ids, or a list of those; got {type(prompts).__name__}") from None
    if not prompts:
        raise ValueError("no prompts given")
    if all(_is_token_id(p) for p in prompts):
        return [prompts]
    return prompts
