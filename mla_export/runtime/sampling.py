"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, per-request seeds (numpy only).

Order of the transforms (as vLLM and transformers apply them): logits / temperature, then
top-k, then top-p on the resulting distribution, then one draw from the request's own
`numpy.random.Generator`. A seeded request therefore draws the same tokens whatever else is
in the batch, and after a preemption (its generator is not rewound: tokens already drawn are
kept, not redrawn).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["SamplingParams", "Sampler", "OUTPUT_KINDS"]

OUTPUT_KINDS = ("cumulative", "delta", "final_only")


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k -1 and top_p 1 disable those filters.

    output_kind (vLLM's RequestOutputKind): what each `RequestOutput` of the request holds.
    "cumulative": all tokens and text so far (copies that grow with the output); "delta": only
    this step's tokens and text; "final_only": one output, when the request finishes."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    output_kind: str = "cumulative"

    def __post_init__(self):
        def is_int(v):
            return isinstance(v, numbers.Integral) and not isinstance(v, bool)

        def is_real(v):
            return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)

        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not is_real(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or not (self.top_k == -1 or self.top_k >= 1):
            raise ValueError(f"top_k must be -1 (disabled) or an integer >= 1, got {self.top_k!r}")
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not all(
            is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {', '.join(OUTPUT_KINDS)}, got {self.output_kind!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_generator(self) -> np.random.Generator:
        """The request's own random stream: from its seed, or fresh OS entropy."""
        return np.random.default_rng(self.seed)


class Sampler:
    def sample(
        self, logits: np.ndarray, params: Sequence[SamplingParams], generators: Sequence[np.random.Generator]
    ) -> np.ndarray:
        """One token id per row of logits [B, vocab]; row b uses params[b] and generators[b]."""
        if logits.ndim != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
            raise ValueError(f"logits {logits.shape} must have one row per request ({len(params)})")
        # First maximum on ties, as torch.argmax and transformers' greedy search pick. Every row's
        # argmax over the logits in place (selecting the greedy rows first copied [B, vocab] floats);
        # the other rows then draw their token.
        tokens = np.argmax(logits, axis=-1).astype(np.int64, copy=False)
        for b, p in enumerate(params):
            if not p.greedy:
                tokens[b] = self._sample_row(logits[b], p, generators[b])
        return tokens

    @staticmethod
    def probabilities(row: np.ndarray, p: SamplingParams) -> np.ndarray:
        """The distribution a non-greedy request draws from: temperature, top-k, top-p, renormalised."""
        x = row.astype(np.float64) / p.temperature
        vocab = x.shape[0]
        if 0 < p.top_k < vocab:
            kth = np.partition(x, vocab - p.top_k)[vocab - p.top_k]
            x = np.where(x < kth, -np.inf, x)  # ties with the k-th value stay, as in vLLM
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        if p.top_p < 1:
            order = np.argsort(-probs, kind="stable")
            sorted_probs = probs[order]
            # Keep the smallest head whose mass reaches top_p: a token stays while the mass
            # before it is still below top_p (the most likely token always stays).
            mass_before = np.cumsum(sorted_probs) - sorted_probs
            drop = order[mass_before >= p.top_p]
            probs[drop] = 0.0
            probs /= probs.sum()
        return probs

    def _sample_row(self, row: np.ndarray, p: SamplingParams, gen: np.random.Generator) -> int:
        probs = self.probabilities(row, p)
        cdf = np.cumsum(probs)
        # side="right" never lands on a zero-probability token (its cdf step is flat); the clip
        # covers a draw rounded up to the total mass.
        idx = int(np.searchsorted(cdf, gen.random() * cdf[-1], side="right"))
        return min(idx, int(np.flatnonzero(probs)[-1]))
