"""One generation request as the scheduler and the engine track it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .sampling import SamplingParams
from .token_counts import OutputTokenIds

__all__ = ["Request", "RequestStatus"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # not admitted yet, or preempted (its blocks were freed)
    RUNNING = "running"  # holds blocks; computing its prompt or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: np.random.Generator
    arrival_time: float = field(default_factory=time.time)
    # append only; keeps what the penalties read up to date (token_counts.py)
    output_token_ids: list[int] = field(default_factory=OutputTokenIds)
    # prompt + output: the tokens whose cache rows the request needs. After a preemption the
    # generated ones are recomputed like prompt tokens.
    all_token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0  # leading tokens whose cache rows are written
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    first_scheduled_time: float | None = None  # when it first got a place in a step (vLLM's queue time ends)
    first_token_time: float | None = None
    finished_time: float | None = None
    num_computed_prompt_tokens: int = 0  # prompt tokens run through the graph (again after a preemption)
    num_cached_prompt_tokens: int = 0  # prompt tokens taken from the prefix cache
    num_preemptions: int = 0
    detokenizer: Any = None  # IncrementalDetokenizer when the model has a tokenizer
    final_text: str | None = None  # the full decode, set when the request finishes
    logprobs: list | None = None  # per output token {token id: Logprob} (params.logprobs set)
    cumulative_logprob: float = 0.0  # sum of the sampled tokens' log-probabilities
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it (vLLM's)
    prompt_logprobs: list | None = None  # per prompt token {token id: Logprob} (params.prompt_logprobs set)
    prompt_logprobs_done: bool = False  # every prompt token's logits have been seen
    # Stop strings (params.stop): text held back because it may still grow into one, and the text
    # emitted so far (the output's text, cut at a stop string).
    pending_text: str = ""
    emitted_text: list[str] = field(default_factory=list)
    grammar: Any = None  # structured_output.RequestGrammar of a request with params.structured_outputs
    # Speculative decoding (spec_decode.py): the draft tokens the next step verifies after the last
    # sampled token (never part of all_token_ids: only accepted tokens are), and the counters.
    spec_token_ids: list[int] = field(default_factory=list)
    spec_num_drafts: int = 0  # verify steps with at least one draft
    spec_num_draft_tokens: int = 0  # drafts verified
    spec_num_accepted_tokens: int = 0  # drafts accepted
    spec_history: Any = None  # spec_decode.TokenBuffer of all_token_ids, for the proposer

    def __post_init__(self):
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def needs_prompt_logits(self) -> bool:
        """Its prompt logprobs are wanted and not complete: every prompt row's logits are needed,
        so its prompt is computed (not taken from the prefix cache) with all rows returned."""
        return self.params.prompt_logprobs is not None and not self.prompt_logprobs_done

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
