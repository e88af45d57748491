"""A request's output token ids, with the per-token facts the penalties read kept up to date.

vLLM's repetition, frequency and presence penalties read which tokens a request's prompt and
output hold and how often each output token occurs. Computed from the whole prompt and output
at every step, that is a copy of both per token (its cost grows with the output); kept here,
updated as each token is appended, a step's penalties cost one pass over the vocabulary row at
any length. The arrays are made on the first step that asks (only requests with penalties pay
for them) and give exactly the values the whole-history computation gives.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["OutputTokenIds", "output_counts", "seen_mask"]


class OutputTokenIds(list):
    """A list of token ids (append only, as a request's output grows) that updates its counts
    and seen-mask, once made, on every append."""

    __slots__ = ("_counts", "_seen")

    def __init__(self, *args):
        super().__init__(*args)
        self._counts: np.ndarray | None = None  # [vocab] float32: occurrences of each token in the output
        self._seen: np.ndarray | None = None  # [vocab] bool: the token is in the prompt or the output

    def append(self, token: int) -> None:
        super().append(token)
        if self._counts is not None:
            self._counts[token] += 1
        if self._seen is not None:
            self._seen[token] = True


def output_counts(output: Sequence[int], vocab: int) -> np.ndarray:
    """[vocab] float32: how often each token occurs in `output` (kept, not recounted, for an
    OutputTokenIds)."""
    kept = getattr(output, "_counts", None)
    if kept is not None and kept.shape[0] == vocab:
        return kept
    counts = np.bincount(np.asarray(output, np.int64), minlength=vocab)[:vocab].astype(np.float32)
    if isinstance(output, OutputTokenIds):
        output._counts = counts
    return counts


def seen_mask(prompt: Sequence[int], output: Sequence[int], vocab: int) -> np.ndarray:
    """[vocab] bool: the tokens that occur in the prompt or the output (kept for an
    OutputTokenIds: its prompt does not change)."""
    kept = getattr(output, "_seen", None)
    if kept is not None and kept.shape[0] == vocab:
        return kept
    seen = np.zeros(vocab, bool)
    seen[np.concatenate([np.asarray(prompt, np.int64), np.asarray(output, np.int64)])] = True
    if isinstance(output, OutputTokenIds):
        output._seen = seen
    return seen
