"""`LLM`: offline batch generation over an `LLMEngine`, in vLLM's shape.

    from mla_export import LLM, SamplingParams          # vLLM: from vllm import LLM, SamplingParams
    llm = LLM(model="out/tiny")                         # an `mla-export export` directory
    outputs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, top_p=0.95))
    outputs[0].prompt, outputs[0].outputs[0].text

`generate` returns one `RequestOutput` per prompt with `n` `CompletionOutput`s (vLLM's
vllm.outputs classes and fields). Without sampling params it uses the model's defaults: vLLM's
`generation_config="auto"` rule (temperature, top_p, top_k, min_p, repetition_penalty and
max_new_tokens of the export's generation_config.json over SamplingParams()'s defaults).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .engine import LLMEngine
from .generation_config import read_generation_defaults
from .prompts import engine_prompts
from .sampling import SamplingParams

__all__ = ["LLM", "CompletionOutput", "RequestOutput"]

# LLM(...) arguments of vLLM's and the engine option each one is (None: accepted, nothing to set).
_VLLM_ARGS = {"model": None, "tokenizer": None, "dtype": None, "max_model_len": "max_model_len",
              "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
              "enable_prefix_caching": "enable_prefix_caching", "trust_remote_code": None, "seed": None,
              "tensor_parallel_size": None, "generation_config": None,
              "speculative_config": "speculative_config", "enforce_eager": "enforce_eager"}
_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "float32": "f32", "float": "f32", "f32": "f32"}


@dataclass
class CompletionOutput:
    """One completion of a prompt (vLLM's vllm.outputs.CompletionOutput)."""

    index: int
    text: str | None
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list | None  # per token {token id: Logprob}, with SamplingParams.logprobs
    finish_reason: str | None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string (None: eos or length)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """All completions of one prompt (vLLM's vllm.outputs.RequestOutput)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    prompt_logprobs: list | None = None  # per prompt token {token id: Logprob}, None for the first
    metrics: object = field(default=None, repr=False)

    # The first completion's fields, for code written against this package's earlier flat outputs.
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str | None:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


class LLM:
    def __init__(self, out_dir: str | Path | None = None, *, engine: LLMEngine | None = None, **kwargs):
        """`LLM(model=dir)` or `LLM(dir)` builds its engine (vLLM's argument names where they mean
        something here: dtype -> precision ("auto" = bf16, "float32"), max_model_len,
        max_num_seqs, max_num_batched_tokens, enable_prefix_caching, seed (the default seed of
        unseeded requests), generation_config ("auto" | "vllm" | a directory); the engine's own options too);
        `LLM(engine=engine)` generates over an engine that already exists. vLLM arguments that
        cannot apply on a CPU with one export raise naming them."""
        model = kwargs.pop("model", None)
        if model is not None and out_dir is not None:
            raise ValueError("give the export directory once: LLM(dir) or LLM(model=dir)")
        out_dir = model if model is not None else out_dir
        tokenizer = kwargs.pop("tokenizer", None)
        if tokenizer is not None and Path(tokenizer) != Path(out_dir or ""):
            raise ValueError("tokenizer: the export carries its own tokenizer (tokenizer.json); a separate one "
                             "is not supported")
        kwargs.pop("trust_remote_code", None)  # nothing here runs a model's remote code
        if kwargs.pop("tensor_parallel_size", 1) != 1:
            raise ValueError("tensor_parallel_size: one process runs the model here (serve --replicas for more)")
        dtype = kwargs.pop("dtype", None)
        if dtype is not None:
            if str(dtype) not in _DTYPES:
                raise ValueError(f"dtype must be one of {sorted(_DTYPES)} (the inference precision), got {dtype!r}")
            if "precision" in kwargs:
                raise ValueError("give dtype or precision, not both")
            kwargs["precision"] = _DTYPES[str(dtype)]
        self._seed = kwargs.pop("seed", None)
        if self._seed is not None and (isinstance(self._seed, bool) or not isinstance(self._seed, int)):
            raise ValueError(f"seed must be an integer, got {self._seed!r}")
        self._generation_config = kwargs.pop("generation_config", "auto")
        if not isinstance(self._generation_config, (str, Path)):
            raise ValueError("generation_config must be 'auto' (the export's generation_config.json), 'vllm' "
                             f"(SamplingParams' own defaults) or a directory, got {self._generation_config!r}")
        if engine is not None:
            if out_dir is not None or kwargs:
                raise ValueError("give either an existing engine or out_dir and engine options, not both")
            if not isinstance(engine, LLMEngine):
                raise TypeError(f"engine must be an LLMEngine, got {type(engine).__name__}")
            self.engine = engine
        elif out_dir is None:
            raise ValueError("LLM needs model= (an `mla-export export` output directory) or engine=")
        else:
            import inspect

            known = set(inspect.signature(LLMEngine.__init__).parameters) - {"self", "out_dir"}
            unknown = sorted(set(kwargs) - known)
            if unknown:
                raise TypeError(f"LLM got argument(s) it does not take: {', '.join(unknown)} (vLLM's that apply "
                                f"here: {', '.join(sorted(_VLLM_ARGS))}; the engine's: {', '.join(sorted(known))})")
            self.engine = LLMEngine(out_dir, **kwargs)
        self.get_default_sampling_params()  # a bad generation_config fails here, not at the first generate
        self._ids = itertools.count()
        self._prompter = None  # the chat template, loaded on the first chat()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the export's generation_config.json sampling keys over it (vLLM's
        generation_config="auto"), or SamplingParams() alone (generation_config="vllm")."""
        given = read_generation_defaults(self._generation_config, self.engine.contract.out_dir)
        return SamplingParams(seed=self._seed, **given)

    def generate(self, prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 use_tqdm: bool = False, **sampling) -> list[RequestOutput]:
        """vLLM's `LLM.generate`: `prompts` is one prompt or a list (strings, token-id lists, or
        vLLM's {"prompt": ...} / {"prompt_token_ids": ...} dicts; prompts.py checks them, naming
        `prompts`); `sampling_params` one for all or one
        per prompt. Keyword arguments are SamplingParams fields over the defaults (this package's
        earlier `generate(prompts, max_tokens=..., temperature=...)`). use_tqdm: accepted, no bar."""
        if not isinstance(use_tqdm, bool):
            raise ValueError(f"use_tqdm must be a bool, got {use_tqdm!r}")
        prompts = engine_prompts(prompts)
        if sampling_params is None:
            base = self.get_default_sampling_params()
            sampling_params = dataclasses.replace(base, **sampling) if sampling else base
        elif sampling:
            raise ValueError(f"give sampling_params or SamplingParams fields ({', '.join(sorted(sampling))}), not both")
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        sampling_params = list(sampling_params)
        if not all(isinstance(p, SamplingParams) for p in sampling_params):
            raise TypeError("sampling_params must be a SamplingParams or a list of them")
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")

        # Each prompt's n completions are n requests (the prefix cache shares the prompt's blocks);
        # a seeded request's i-th completion draws with seed + i. Only final outputs are read.
        jobs = []  # (prompt index, completion index, request id, params)
        for k, params in enumerate(sampling_params):
            for i in range(params.n):
                seed = None if params.seed is None else params.seed + i
                # The prompt's logprobs are the same for every completion: the first computes them
                # (the others may then take the prompt from the prefix cache).
                prompt_lp = params.prompt_logprobs if i == 0 else None
                one = dataclasses.replace(params, n=1, seed=seed, output_kind="final_only", prompt_logprobs=prompt_lp)
                jobs.append((k, i, f"llm-{next(self._ids)}", one))
        try:
            for k, _, rid, params in jobs:
                self.engine.add_request(rid, prompts[k], params)
            final = {}
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        final[out.request_id] = out
        finally:  # an error (or Ctrl-C) must not leave requests holding blocks
            for _, _, rid, _ in jobs:
                self.engine.abort_request(rid)
        for k, _, rid, _ in jobs:
            if final[rid].finish_reason == "error":
                raise RuntimeError(f"prompt {k} failed: {final[rid].error}")
        results = []
        for k, prompt in enumerate(prompts):
            mine = [(i, final[rid]) for kk, i, rid, _ in jobs if kk == k]
            first = mine[0][1]
            results.append(RequestOutput(
                request_id=str(k), prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=list(first.prompt_token_ids),
                outputs=[CompletionOutput(i, o.text, list(o.token_ids), o.cumulative_logprob, o.logprobs,
                                          o.finish_reason, o.stop_reason) for i, o in mine],
                prompt_logprobs=first.prompt_logprobs, metrics=first.metrics))
        return results

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
