"""Sampling parameters and the sampler (numpy only): vLLM's SamplingParams fields and order.

The logits of a row are first processed (vLLM's logits processors, in its order): `logit_bias`
added, `allowed_token_ids` kept, `bad_words` masked (a word's last token, where the output ends
with its other tokens), eos / stop tokens masked until `min_tokens`, then the penalties:
repetition (tokens of the prompt and the output: positive logits divided by it, negative ones
multiplied), frequency (times each token's count in the output) and presence (once per token in
the output) subtracted. Greedy takes the first maximum of the processed row; sampling divides by
the temperature, drops tokens under `min_p` times the most likely one's probability, keeps top-k,
then top-p, and draws once from the request's own `numpy.random.Generator`. A seeded request
therefore draws the same tokens whatever else is in the batch, and after a preemption (its
generator is not rewound: tokens already drawn are kept, not redrawn). `logprobs` are vLLM's
default "raw" ones: the log-softmax of the model's logits before any processing. A request with
`structured_outputs` has its row masked by its grammar before all of this (the engine applies
structured_output.py's bitmask first, as vLLM does), so its logprobs are those of the masked row.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

# vLLM's vllm.sampling_params holds these too
from .structured_output import GuidedDecodingParams, StructuredOutputsParams
from .token_counts import output_counts, seen_mask

__all__ = ["SamplingParams", "SamplingParamError", "Sampler", "OUTPUT_KINDS", "Logprob", "token_logprobs",
           "rows_logprobs", "StructuredOutputsParams", "GuidedDecodingParams", "SAMPLING_EPS", "MAX_N", "NO_TOKEN",
           "token_id_key"]

OUTPUT_KINDS = ("cumulative", "delta", "final_only")
MAX_LOGPROBS = 20  # top log-probabilities per token (OpenAI's limit)
# vLLM's _SAMPLING_EPS: a temperature below it samples greedily. Dividing the logits by a smaller
# one overflowed (1e-310 made every token the last vocabulary id); greedy is what sampling tends
# to as the temperature goes to 0. vLLM also lifts 0 < t < 1e-2 to 1e-2; here [1e-5, 1e-2) is
# used as given (the division is in float64, where it cannot overflow).
SAMPLING_EPS = 1e-5
MAX_N = 1024  # completions per prompt: each one is a request of its own (the server allows 16)
_MAX_TOKEN_ID_DIGITS = 18  # a logit_bias key given as text: a longer one is no vocabulary's token id
_F32_MAX = float(np.finfo(np.float32).max)
NO_TOKEN = -1  # Sampler.sample's answer for a row with no token left to generate


def token_id_key(k) -> int | None:
    """A logit_bias key given as text (JSON object keys are strings) as a token id, else None:
    ASCII digits only (int() also reads "٣" as 3) and few enough to convert (int() of a
    5000-digit key raises an error of its own)."""
    if isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= _MAX_TOKEN_ID_DIGITS:
        return int(k)
    return None


class SamplingParamError(ValueError):
    """A sampling value refused where it enters; `param` names the field (the server's 400 says it)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k -1 and top_p 1 disable those filters.

    output_kind (vLLM's RequestOutputKind): what each `RequestOutput` of the request holds.
    "cumulative": all tokens and text so far (copies that grow with the output); "delta": only
    this step's tokens and text; "final_only": one output, when the request finishes."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 (vLLM's newer spelling): off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    output_kind: str = "cumulative"
    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # > 0; 1 = off
    min_p: float = 0.0  # [0, 1]
    min_tokens: int = 0  # eos and stop_token_ids masked until this many tokens are out
    logit_bias: dict | None = None  # token id -> added to its logit ([-100, 100])
    allowed_token_ids: tuple[int, ...] | None = None  # only these may be generated
    logprobs: int | None = None  # log-probabilities of the sampled token and of this many top ones
    prompt_logprobs: int | None = None  # the same for every prompt token after the first (no prefix cache hit)
    stop: tuple[str, ...] = ()  # strings that end the output (cut there; needs a tokenizer)
    include_stop_str_in_output: bool = False
    n: int = 1  # completions per prompt (LLM.generate and the server fan a prompt out into n requests)
    bad_words: tuple[str, ...] = ()  # words never generated (vLLM's rule; the engine tokenizes them)
    # bad_words as token-id sequences, with and without a leading space (set by the engine from its
    # tokenizer; vLLM's _bad_words_token_ids): a sequence's last token is banned after the others.
    bad_words_token_ids: tuple[tuple[int, ...], ...] | None = None
    # A grammar the output must follow (structured_output.py): vLLM's StructuredOutputsParams, or a
    # dict of its fields; guided_decoding is vLLM's older name (GuidedDecodingParams) for the same.
    structured_outputs: Any = None
    guided_decoding: Any = None

    def __post_init__(self):
        try:
            self._check()
        except SamplingParamError:
            raise
        except ValueError as e:  # every message starts with its field's name
            raise SamplingParamError(str(e).split(" ", 1)[0].rstrip(":"), str(e)) from None

    def _check(self):
        """Every field's domain, checked once here (the server's parsed values come through it too):
        numbers are finite, and a value the sampler cannot compute with is refused or, for a
        temperature under SAMPLING_EPS, taken as greedy."""
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
        if not is_int(self.top_k) or not (self.top_k in (-1, 0) or self.top_k >= 1):
            raise ValueError(f"top_k must be -1 or 0 (disabled) or an integer >= 1, got {self.top_k!r}")
        if self.seed is not None and (not is_int(self.seed) or self.seed < -1):
            raise ValueError(f"seed must be an integer >= 0 (None or -1: unseeded), got {self.seed!r}")
        if self.seed == -1:  # vLLM's spelling of "no seed"
            object.__setattr__(self, "seed", None)
        if isinstance(self.stop_token_ids, (str, bytes)) or not all(
            is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {', '.join(OUTPUT_KINDS)}, got {self.output_kind!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not is_real(v) or not -2 <= v <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {v!r}")
        if not is_real(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be a number > 0, got {self.repetition_penalty!r}")
        if not is_real(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict of token id -> bias, got {type(self.logit_bias).__name__}")
            bias = {}
            for k, v in self.logit_bias.items():
                key = token_id_key(k) if isinstance(k, str) else k
                if not is_int(key) or key < 0:
                    raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {str(k)[:40]!r}")
                if not is_real(v) or not -100 <= v <= 100:
                    raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {v!r} for token {k}")
                bias[int(key)] = float(v)
            object.__setattr__(self, "logit_bias", bias or None)
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if isinstance(ids, (str, bytes)) or not ids or not all(is_int(t) and t >= 0 for t in ids):
                raise ValueError(f"allowed_token_ids must be a non-empty list of token ids, got {ids!r}")
            object.__setattr__(self, "allowed_token_ids", tuple(int(t) for t in ids))
        if self.logprobs is not None and (not is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (top tokens besides the "
                             f"sampled one), got {self.logprobs!r}")
        if self.prompt_logprobs is not None and (not is_int(self.prompt_logprobs)
                                                 or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise ValueError(f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}] (top tokens besides the "
                             f"prompt's own), got {self.prompt_logprobs!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if stop is None:
            stop = ()
        if isinstance(stop, bytes) or not all(isinstance(x, str) and x for x in stop):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(stop))
        if not isinstance(self.include_stop_str_in_output, bool):
            raise ValueError(f"include_stop_str_in_output must be a bool, got {self.include_stop_str_in_output!r}")
        if not is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an integer in [1, {MAX_N}], got {self.n!r}")
        words = (self.bad_words,) if isinstance(self.bad_words, str) else (self.bad_words or ())
        if isinstance(words, bytes) or not all(isinstance(w, str) and w.strip() for w in words):
            raise ValueError(f"bad_words must be a list of non-empty strings, got {self.bad_words!r}")
        object.__setattr__(self, "bad_words", tuple(words))
        if self.bad_words_token_ids is not None:
            seqs = self.bad_words_token_ids
            if isinstance(seqs, (str, bytes)) or not all(
                    not isinstance(s, (str, bytes)) and len(s) >= 1 and all(is_int(t) and t >= 0 for t in s) for s in seqs):
                raise ValueError(f"bad_words_token_ids must be non-empty sequences of token ids, got {seqs!r}")
            object.__setattr__(self, "bad_words_token_ids", tuple(tuple(int(t) for t in s) for s in seqs))
        self._check_structured_outputs()
        if self.top_k == 0:  # vLLM's newer default spelling of "off"
            object.__setattr__(self, "top_k", -1)

    def _check_structured_outputs(self) -> None:
        so, old = self.structured_outputs, self.guided_decoding
        if old is not None:
            if so is not None and so is not old:
                raise ValueError("structured_outputs: give it or guided_decoding (its older name), not both")
            so = old
            object.__setattr__(self, "guided_decoding", None)
        if isinstance(so, dict):
            try:
                so = StructuredOutputsParams(**so)
            except TypeError as e:  # a key that is no field
                raise ValueError(f"structured_outputs: {e}") from None
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, got {type(so).__name__}")
        object.__setattr__(self, "structured_outputs", so)

    @property
    def processes_logits(self) -> bool:
        """Whether the row is changed before greedy / sampling (penalties, bias, masks)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias or self.allowed_token_ids is not None or self.min_tokens
                    or self.bad_words_token_ids)

    @property
    def greedy(self) -> bool:
        """Temperature 0, or under SAMPLING_EPS (vLLM's rule; top_p, top_k and min_p then do nothing)."""
        return self.temperature < SAMPLING_EPS

    def make_generator(self) -> np.random.Generator:
        """The request's own random stream: from its seed, or fresh OS entropy."""
        return np.random.default_rng(self.seed)


@dataclass(frozen=True)
class Logprob:
    """vLLM's Logprob: a token's log-probability, its rank (1 = most likely) and its text."""

    logprob: float
    rank: int
    decoded_token: str | None = None


def token_logprobs(row: np.ndarray, token: int, k: int) -> tuple[float, dict[int, Logprob]]:
    """(the sampled token's log-probability, {token id: Logprob} of it and the k most likely) from
    one row of raw logits (log-softmax in float64)."""
    x = row.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    own = float(x[token] - lse)
    out = {int(token): Logprob(own, int((x > x[token]).sum()) + 1)}
    if k:
        top = np.argpartition(-x, k - 1)[:k] if k < x.shape[0] else np.arange(x.shape[0])
        top = top[np.argsort(-x[top], kind="stable")]
        for rank, t in enumerate(top.tolist(), 1):
            out.setdefault(int(t), Logprob(float(x[t] - lse), rank))
    return own, out


def rows_logprobs(rows: np.ndarray, tokens: Sequence[int], k: int, chunk: int = 64) -> list[dict[int, Logprob]]:
    """`token_logprobs` of many rows at once (prompt logprobs: row i's logits against tokens[i]),
    vectorised over chunks of rows so a long prompt never holds [T, vocab] float64 at once."""
    out = []
    tokens = np.asarray(tokens, dtype=np.int64)
    for lo in range(0, rows.shape[0], chunk):
        x = rows[lo:lo + chunk].astype(np.float64)
        tok = tokens[lo:lo + chunk]
        m = x.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
        own_logit = x[np.arange(x.shape[0]), tok]
        ranks = (x > own_logit[:, None]).sum(axis=1) + 1
        own = own_logit - lse
        if k:
            top = np.argpartition(-x, k - 1, axis=1)[:, :k] if k < x.shape[1] else \
                np.broadcast_to(np.arange(x.shape[1]), x.shape)
            vals = np.take_along_axis(x, top, axis=1)
            order = np.argsort(-vals, axis=1, kind="stable")
            top, vals = np.take_along_axis(top, order, axis=1), np.take_along_axis(vals, order, axis=1)
        for i in range(x.shape[0]):
            entry = {int(tok[i]): Logprob(float(own[i]), int(ranks[i]))}
            if k:
                for rank, (t, v) in enumerate(zip(top[i].tolist(), (vals[i] - lse[i]).tolist()), 1):
                    entry.setdefault(int(t), Logprob(float(v), rank))
            out.append(entry)
    return out


class Sampler:
    def sample(
        self, logits: np.ndarray, params: Sequence[SamplingParams], generators: Sequence[np.random.Generator],
        histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None, eos_token_ids: Sequence[int] = (),
    ) -> np.ndarray:
        """One token id per row of logits [B, vocab]; row b uses params[b] and generators[b].
        histories[b]: (prompt token ids, output token ids) of row b's request, needed by the
        penalties and min_tokens (processes_logits); eos_token_ids: what min_tokens holds back.
        NO_TOKEN for a row whose processing masked every token (allowed_token_ids all banned by
        bad_words, or only eos under min_tokens): greedy took token 0 and sampling drew from NaN."""
        if logits.ndim != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
            raise ValueError(f"logits {logits.shape} must have one row per request ({len(params)})")
        # First maximum on ties, as torch.argmax and transformers' greedy search pick. Every row's
        # argmax over the logits in place (selecting the greedy rows first copied [B, vocab] floats);
        # the other rows then draw their token.
        tokens = np.argmax(logits, axis=-1).astype(np.int64, copy=False)
        for b, p in enumerate(params):
            row = logits[b]
            if p.processes_logits:
                if histories is None:
                    raise ValueError("penalties, logit_bias, allowed_token_ids and min_tokens need the requests' "
                                     "token histories")
                row = self.process(row, p, *histories[b], eos_token_ids)
                if not np.isfinite(row).any():
                    tokens[b] = NO_TOKEN
                    continue
                if p.greedy:
                    tokens[b] = int(np.argmax(row))
            if not p.greedy:
                tokens[b] = self._sample_row(row, p, generators[b])
        return tokens

    @staticmethod
    def process(row: np.ndarray, p: SamplingParams, prompt: Sequence[int], output: Sequence[int],
                eos_token_ids: Sequence[int] = ()) -> np.ndarray:
        """The row after vLLM's logits processors (a float32 copy; the module docstring has the order)."""
        x = row.astype(np.float32, copy=True)
        vocab = x.shape[0]
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias, np.int64)
            keep = ids < vocab
            x[ids[keep]] += np.fromiter(p.logit_bias.values(), np.float32)[keep]
        if p.allowed_token_ids is not None:
            mask = np.full(vocab, -np.inf, np.float32)
            ids = np.asarray([t for t in p.allowed_token_ids if t < vocab], np.int64)
            mask[ids] = 0.0
            x += mask
        for seq in p.bad_words_token_ids or ():
            # vLLM's rule: the last token is banned where the output ends with the ones before it.
            if seq[-1] < vocab and (len(seq) == 1 or (len(output) >= len(seq) - 1
                                                       and list(output[len(output) - len(seq) + 1:]) == list(seq[:-1]))):
                x[seq[-1]] = -np.inf
        if len(output) < p.min_tokens:
            held = [t for t in (*eos_token_ids, *p.stop_token_ids) if t < vocab]
            x[held] = -np.inf
        if p.repetition_penalty != 1:
            seen = seen_mask(prompt, output, vocab)  # kept per request as its output grows (token_counts.py)
            v = x[seen]
            with np.errstate(over="ignore", divide="ignore"):  # capped below
                x[seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if (p.frequency_penalty or p.presence_penalty) and len(output):
            counts = output_counts(output, vocab)
            x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        # A repetition penalty near 0 divides a positive logit past float32's range, and +inf would
        # make the sampler's exp(x - max) NaN: the largest float keeps it the favourite (-inf stays).
        np.minimum(x, _F32_MAX, out=x)
        return x

    @staticmethod
    def probabilities(row: np.ndarray, p: SamplingParams) -> np.ndarray:
        """The distribution a non-greedy request draws from: temperature, top-k, top-p, renormalised."""
        x = row.astype(np.float64) / p.temperature
        vocab = x.shape[0]
        if p.min_p > 0:  # vLLM V1: after the temperature, before top-k / top-p
            probs = np.exp(x - x.max())
            x = np.where(probs < p.min_p * probs.max(), -np.inf, x)
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
