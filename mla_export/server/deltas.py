"""`Delta`: what every engine client yields for a sequence after an engine step.

Both `EngineLoop` (the engine in this process) and `RayEngineClient` (engine replicas) put
`Delta`s (and `Aborted`) on a submission's queue, built once where the engine's output is read
(`delta_of`); the Ray path sends them over its output channel as they are (ray_serve/wire.py).
A delta holds only what the step added, so a step's hand-over costs the same at token 10 and
token 10 000: the HTTP layer (generation.py) keeps each choice's tokens, text and logprobs
itself, appended to, never copied.

The server submits its sequences with `output_kind="delta"`, so the engine itself copies
nothing per step either (RequestOutput: the new tokens and text, the prompt by reference). Stop
strings are matched in the engine, incrementally (runtime/stop_strings.py): the text of a delta
is already cut at a stop string and holds back what may still grow into one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Delta", "delta_of"]


@dataclass
class Delta:
    """One sequence's progress in one engine step."""

    request_id: str
    new_token_ids: list[int]
    new_text: str | None  # None: the model has no tokenizer
    finished: bool
    finish_reason: str | None
    error: str | None = None
    text: str | None = None  # the whole text, on the finishing delta only (the engine's final decode)
    num_prompt_tokens: int = 0  # on the finishing delta only
    new_logprobs: list | None = None  # per new token {token id: Logprob} (requests with logprobs)
    prompt_logprobs: list | None = None  # on the request's first delta only (prompt_logprobs asked)


def delta_of(out) -> Delta:
    """The delta of an engine `RequestOutput`. The server asks for "delta" outputs; a
    "cumulative" one (another caller's engine, a test's fake) gives the same delta: its last
    tokens' logprobs, its prompt logprobs only with its first tokens."""
    fin = bool(out.finished)
    new = out.new_token_ids or []
    lps = getattr(out, "logprobs", None)
    if lps is not None:
        lps = lps[len(lps) - len(new):] if new else []
    plp = getattr(out, "prompt_logprobs", None)
    if plp is not None and len(out.token_ids or ()) > len(new):  # sent with the first tokens already
        plp = None
    text = None
    if fin:  # the final decode: a "delta" output carries it apart, a cumulative one as its text
        text = out.final_text if getattr(out, "final_text", None) is not None else out.text
    return Delta(out.request_id, list(new), out.new_text, fin, out.finish_reason,
                 getattr(out, "error", None), text, len(out.prompt_token_ids or ()) if fin else 0, lps, plp)
