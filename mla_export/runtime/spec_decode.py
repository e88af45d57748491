"""Speculative decoding: the config, the n-gram (prompt-lookup) proposer, the verifier. (MTP
drafts, method "mtp": the export's draft graph, proposed by runtime/mtp_propose.py.)

vLLM's `ngram` method. After a request samples a token, the proposer looks for the most recent
earlier occurrence of the sequence's last n tokens (n from prompt_lookup_max down to
prompt_lookup_min) in its prompt + output, and proposes the (up to) k tokens that followed it.
The next step feeds the last sampled token plus the k drafts (k + 1 new positions, as a prefill
chunk does) and returns the logits of all k + 1 positions; `verify_token` then walks them in
order: row i is the target model's distribution of the token after draft i - 1, so each draft
is checked against it, the accepted prefix is kept, and the first rejected position (or the
bonus position after k accepted drafts) gives one more token from the target distribution.

Greedy: draft d is accepted when it is the token plain decoding would take (the argmax of the
processed row), so the output is the one plain greedy decoding gives. Sampling: n-gram drafts
are deterministic proposals (q = one-hot on d), so standard rejection sampling reduces to:
accept d with probability p(d), else draw from p with d removed and renormalised. The token
emitted at each position is then distributed exactly as p (P(d) = p(d); P(x != d) =
(1 - p(d)) * p(x) / (1 - p(d)) = p(x)), so the output keeps the target distribution. A seeded
request draws more random numbers than in plain decoding, so its tokens differ from a plain
run's with the same seed (the distribution is the same; vLLM behaves alike).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .sampling import NO_TOKEN, Sampler, SamplingParams

__all__ = ["SpeculativeConfig", "TokenBuffer", "propose_ngram", "verify_token", "rejection_sample", "METHODS"]

METHODS = ("ngram", "mtp")
# vLLM's names for the MTP method of a model family: DeepSeek's layer is the one built here (vLLM
# runs DeepSeek-V3's, V3.2's and GLM-5's MTP layers as deepseek_mtp too).
_MTP_ALIASES = ("mtp", "deepseek_mtp")
_NOT_BUILT = ("glm4_moe_mtp",)  # GLM-4.5/4.6/4.7's MTP layer (those models are not MLA): refused as not built
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")
_NGRAM_KEYS = ("prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's `speculative_config` for methods "ngram" and "mtp" (the keys it takes here; others are
    refused). prompt_lookup_max/min: ngram only (None for mtp)."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int | None
    prompt_lookup_min: int | None

    @classmethod
    def parse(cls, value) -> "SpeculativeConfig | None":
        """None, a dict or its JSON text (as `--speculative-config` gives it), or a SpeculativeConfig.
        Defaults as vLLM's: neither lookup bound given -> both 5; one given -> the other equals it."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config: not JSON ({e.msg} at character {e.pos}): {value[:80]!r}") \
                    from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict (or its JSON text), got {type(value).__name__}")
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise ValueError(f"speculative_config: key(s) {', '.join(map(repr, unknown))} not supported here "
                             f"(the keys taken: {', '.join(_KEYS)})")
        method = value.get("method")
        if method == "[ngram]":  # vLLM's older spelling
            method = "ngram"
        if method in _NOT_BUILT:
            raise ValueError(f"speculative_config: method {method!r} is not built (GLM-4.5's MTP layer, not an "
                             f"MLA model's); 'ngram' and 'mtp' (the MTP layer of DeepSeek-V3/V3.2, Kimi K2 and "
                             f"GLM-5, alias 'deepseek_mtp') run here")
        if method in _MTP_ALIASES:
            method = "mtp"
        if method not in METHODS:
            raise ValueError(f"speculative_config: method {method!r} is not supported; 'ngram' and 'mtp' "
                             f"(alias 'deepseek_mtp') run here")
        k = value.get("num_speculative_tokens")
        if method == "mtp":
            given = [key for key in _NGRAM_KEYS if key in value]
            if given:
                raise ValueError(f"speculative_config: {', '.join(given)} apply to method 'ngram' only, not 'mtp'")
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ValueError(f"speculative_config: num_speculative_tokens must be an integer >= 1, got {k!r}")
            return cls("mtp", k, None, None)
        lo, hi = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
        for name, v in (("num_speculative_tokens", k), ("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if (v is not None or name == "num_speculative_tokens") and (
                    not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"speculative_config: {name} must be an integer >= 1, got {v!r}")
        if lo is None and hi is None:
            lo = hi = 5
        elif lo is None:
            lo = hi
        elif hi is None:
            hi = lo
        if lo > hi:
            raise ValueError(f"speculative_config: prompt_lookup_min ({lo}) must not exceed prompt_lookup_max ({hi})")
        return cls("ngram", k, hi, lo)


class TokenBuffer:
    """A request's prompt + output as a growing int64 array: each step copies only the tokens
    added since the last one (amortised O(1) per token), not the whole list (O(len) per step,
    which at batch 64 and long contexts would cost more than the lookup itself)."""

    def __init__(self):
        self._buf = np.empty(0, dtype=np.int64)
        self._len = 0

    def sync(self, tokens: Sequence[int]) -> np.ndarray:
        """The tokens as an array view; `tokens` only ever grows at its end (all_token_ids)."""
        n = len(tokens)
        if n > self._buf.shape[0]:
            grown = np.empty(max(n, 2 * self._buf.shape[0]), dtype=np.int64)
            grown[:self._len] = self._buf[:self._len]
            self._buf = grown
        self._buf[self._len:n] = tokens[self._len:n]
        self._len = n
        return self._buf[:n]


def propose_ngram(tokens: np.ndarray, k: int, n_max: int, n_min: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the last n tokens, for the
    largest n in [n_min, n_max] that has one; [] when none matches. `tokens`: prompt + output, 1-D.

    O(len) per n: candidate starts are found with one comparison of the whole sequence against the
    last token, and only those are checked against the rest of the n-gram."""
    length = tokens.shape[0]
    if k < 1 or length < n_min + 1:
        return []
    last = tokens[-1]
    # Windows ending at e (e < length - 1: an earlier occurrence, with a token after it).
    ends = np.flatnonzero(tokens[:-1] == last)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        cand = ends[ends >= n - 1]
        if cand.size == 0:
            continue  # (smaller n may still match: fewer candidates are cut off at the start)
        ok = np.ones(cand.size, dtype=bool)
        for j in range(1, n):  # compare the n-gram's other tokens, right to left
            ok &= tokens[cand - j] == tokens[length - 1 - j]
        hits = cand[ok]
        if hits.size:
            start = int(hits[-1]) + 1
            return tokens[start:start + k].tolist()
    return []


def rejection_sample(probs: np.ndarray, draft: int, gen: np.random.Generator) -> tuple[int, bool]:
    """(token, accepted) for a deterministic draft against the target distribution `probs`:
    accept with probability p(draft), else draw from p with the draft removed, renormalised."""
    p_draft = float(probs[draft])
    if gen.random() < p_draft:
        return draft, True
    rest = probs.astype(np.float64, copy=True)
    rest[draft] = 0.0
    total = rest.sum()
    if total <= 0.0:  # p(draft) rounds to 1 and the draw still fell above it: nothing else can come
        return draft, True
    cdf = np.cumsum(rest)
    idx = int(np.searchsorted(cdf, gen.random() * cdf[-1], side="right"))
    return min(idx, int(np.flatnonzero(rest)[-1])), False


def verify_token(sampler: Sampler, row: np.ndarray, params: SamplingParams, gen: np.random.Generator,
                 history: tuple[Sequence[int], Sequence[int]], eos_token_ids: Sequence[int],
                 draft: int | None) -> tuple[int, bool]:
    """The token of one verify position and whether it is the draft. `history` is (prompt, output
    so far): the output already holds the tokens accepted at the earlier positions of this step,
    so penalties, bad_words and min_tokens see exactly what plain decoding would. `draft` None: the
    bonus position (plain sampling). NO_TOKEN when processing left no token."""
    if draft is None or params.greedy:
        token = int(sampler.sample(row[None, :], [params], [gen], [history], eos_token_ids)[0])
        return token, draft is not None and token == draft
    if params.processes_logits:
        row = sampler.process(row, params, *history, eos_token_ids)
        if not np.isfinite(row).any():
            return NO_TOKEN, False
    return rejection_sample(sampler.probabilities(row, params), draft, gen)
