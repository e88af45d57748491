"""Structured outputs (vLLM's `StructuredOutputsParams`) on llguidance's grammar engine.

A request may carry one constraint: a JSON schema (`json`), any JSON object (`json_object`), a
regular expression (`regex`), one of a list of strings (`choice`) or a context-free grammar
(`grammar`: Lark syntax as llguidance takes it, or GBNF). Each is turned into an llguidance
grammar without a tokenizer (`grammar_of`: a bad spec is a ValueError naming its field, before
the request enters the engine), then compiled against the model's tokenizer into a matcher.

Per engine step (`StructuredOutputs.mask`), every constrained row of the logits gets its
matcher's token bitmask (computed for the whole batch by llguidance's parallel executor into one
int32 array) applied as -inf before anything else sees the row: the logits processors, the
sampler and the "raw" logprobs, as vLLM applies the grammar bitmask before its sampler. After
sampling, the matcher consumes the token (`RequestGrammar.accept`); when the grammar can take no
more (`finished`), the request ends with finish_reason "stop". The end-of-sequence token is in
the mask only while the grammar accepts what was generated.

Compiling a grammar against the tokenizer (llguidance builds a lexer over the vocabulary) can
take a while for big schemas, so it runs on a worker thread (llguidance drops the GIL), started
by `add_request`: the prompt's prefill runs meanwhile, and the step that samples the request's
first token waits only for what is left. Compiled matchers are cached by grammar (LRU); each
request gets a copy. The matcher follows the request's output tokens: it is checked against
them each step and rolled back or advanced if they differ (a preempted request keeps its
tokens today, so this is a guard, not a path taken).
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import threading
from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np

__all__ = ["StructuredOutputsParams", "GuidedDecodingParams", "StructuredOutputError", "grammar_of",
           "StructuredOutputs", "RequestGrammar", "BACKENDS"]

KINDS = ("json", "regex", "choice", "grammar", "json_object")
BACKENDS = ("guidance", "llguidance", "auto")  # names of the one backend here (vLLM's "guidance" is llguidance)
_CACHE_SIZE = 128  # compiled grammars kept per engine


class StructuredOutputError(ValueError):
    """A constraint that cannot be used; `field` is the StructuredOutputsParams field at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"structured_outputs.{field}: {message}")
        self.field = field
        self.reason = message


@dataclass(frozen=True)
class StructuredOutputsParams:
    """vLLM's vllm.sampling_params.StructuredOutputsParams: exactly one of json (a JSON schema,
    as a dict or its JSON text), regex, choice (a list of strings), grammar (Lark or GBNF),
    json_object (True: any JSON object). Options: disable_any_whitespace (no whitespace between
    JSON tokens), disable_additional_properties (objects of the schema take only the properties
    it lists), whitespace_pattern (a regex for JSON whitespace). disable_fallback is accepted
    (there is no other backend to fall back to); structural_tag is not supported."""

    json: str | dict | None = None
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self):
        if self.structural_tag is not None:
            raise StructuredOutputError("structural_tag", "structural tags are not supported")
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs: give exactly one of json, regex, choice, grammar or json_object, "
                             f"got {', '.join(given) if given else 'none'}")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise StructuredOutputError("json", f"must be a JSON schema (a dict or its JSON text), got "
                                                f"{type(self.json).__name__}")
        for name in ("regex", "grammar", "whitespace_pattern"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise StructuredOutputError(name, f"must be a non-empty string, got {v!r}")
        if self.choice is not None:
            if isinstance(self.choice, (str, bytes)) or not isinstance(self.choice, Sequence) or not self.choice \
                    or not all(isinstance(c, str) and c for c in self.choice):
                raise StructuredOutputError("choice", f"must be a non-empty list of non-empty strings, got "
                                                      f"{self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))
        for name in ("json_object", "disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise StructuredOutputError(name, f"must be a boolean, got {v!r}")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> str:
        """The spec as canonical text: what the compile cache is keyed by."""
        d = {f.name: getattr(self, f.name) for f in fields(StructuredOutputsParams)}
        if isinstance(d["json"], str):  # the same schema as text or as a dict is one key
            try:
                d["json"] = json.loads(d["json"])
            except ValueError:
                pass
        d["choice"] = list(d["choice"]) if d["choice"] is not None else None
        return json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older name (SamplingParams(guided_decoding=GuidedDecodingParams(...))), with its
    `backend`: only llguidance's names ("guidance", "llguidance", "auto") are accepted."""

    backend: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.backend is not None and self.backend.split(":")[0] not in BACKENDS:
            raise ValueError(f"guided_decoding.backend: {self.backend!r} is not available; the backend here is "
                             f"llguidance ({', '.join(BACKENDS)})")


def _no_additional_properties(schema):
    """The schema with additionalProperties false on every object schema that does not set it
    (vLLM's disable_additional_properties)."""
    if isinstance(schema, list):
        return [_no_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _no_additional_properties(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


_grammar_cache: collections.OrderedDict[str, str] = collections.OrderedDict()  # spec key -> grammar
_grammar_lock = threading.Lock()


def grammar_of(so: StructuredOutputsParams) -> str:
    """The llguidance grammar of a spec, checked without a tokenizer (StructuredOutputError
    naming the field when the schema, regex, choices or grammar cannot be used). Cached by
    spec for the process: the server's check of a request warms it for the engine."""
    key = so.key()
    with _grammar_lock:
        grammar = _grammar_cache.get(key)
        if grammar is not None:
            _grammar_cache.move_to_end(key)
            return grammar
    grammar = _grammar_of(so)
    with _grammar_lock:
        _grammar_cache[key] = grammar
        while len(_grammar_cache) > _CACHE_SIZE:
            _grammar_cache.popitem(last=False)
    return grammar


def _grammar_of(so: StructuredOutputsParams) -> str:
    import llguidance

    kind = so.kind
    # vLLM's options for llguidance: flexible whitespace unless disabled, oneOf read as anyOf
    json_options = {"whitespace_flexible": not so.disable_any_whitespace, "coerce_one_of": True}
    if so.whitespace_pattern is not None:
        json_options["whitespace_pattern"] = so.whitespace_pattern
    try:
        if kind in ("json", "json_object"):
            schema = so.json if kind == "json" else {"type": "object"}
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise StructuredOutputError("json", f"not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise StructuredOutputError("json", f"a JSON schema is an object, got {type(schema).__name__}")
            if so.disable_additional_properties:
                schema = _no_additional_properties(schema)
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=json_options)
        elif kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(so.regex)
        elif kind == "choice":
            # One Lark rule of string literals (JSON string syntax is Lark's).
            grammar = llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in so.choice))
        else:
            grammar = llguidance.grammar_from("grammar", so.grammar)  # Lark, or GBNF converted to Lark
    except StructuredOutputError:
        raise
    except (ValueError, TypeError) as e:
        raise StructuredOutputError(kind, str(e)) from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        what = {"json": "invalid JSON schema", "json_object": "invalid", "regex": "invalid regex",
                "choice": "invalid choices", "grammar": "invalid grammar"}[kind]
        raise StructuredOutputError(kind, f"{what}: {error.strip()}")
    return grammar


class RequestGrammar:
    """One request's matcher and how many of its output tokens it has consumed."""

    def __init__(self, template: concurrent.futures.Future):
        self._template = template
        self._matcher = None
        self.num_consumed = 0
        self.error: str | None = None

    @property
    def matcher(self):
        """The matcher (None once `error` is set); waits for the compile started in add_request
        if it is still running."""
        if self._matcher is None and self.error is None:
            try:
                self._matcher = self._template.result().deep_copy()
            except Exception as e:  # noqa: BLE001 - a compile that failed fails this request only
                self.error = str(e)
        return self._matcher

    def follow(self, output_token_ids: Sequence[int]) -> None:
        """Make the matcher's state that of these output tokens (rolls back or advances)."""
        n = len(output_token_ids)
        if self.matcher is None:
            return
        if n < self.num_consumed:
            self.matcher.rollback(self.num_consumed - n)
            self.num_consumed = n
        elif n > self.num_consumed:
            for t in output_token_ids[self.num_consumed:]:
                if not self.accept(t):
                    return

    def accept(self, token: int) -> bool:
        """Consume a sampled token; False (and `error` set) when the grammar does not allow it."""
        m = self.matcher
        if m is None:
            return False
        if not m.consume_token(int(token)):
            # llguidance's message goes on with the parser state and the grammar: its first line says it
            self.error = (m.get_error() or "").strip().split("\n")[0] or f"token {token} is not allowed by the grammar"
            return False
        self.num_consumed += 1
        return True

    @property
    def finished(self) -> bool:
        """The grammar is complete and can take no more tokens."""
        return self._matcher is not None and self._matcher.is_stopped() and not self._matcher.is_error()


class StructuredOutputs:
    """An engine's grammar machinery: the tokenizer as llguidance sees it (built on first use),
    the compile cache and workers, the batched bitmask."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Sequence[int]):
        self._tokenizer = tokenizer  # tokenizers.Tokenizer (or None: no structured outputs)
        self.vocab_size = int(vocab_size)
        self._eos = sorted(int(t) for t in eos_token_ids)
        self._ll_tokenizer: concurrent.futures.Future | None = None  # llguidance.LLTokenizer
        self._executor = None  # llguidance.LLExecutor: masks of a batch in parallel
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._compiled: collections.OrderedDict[str, concurrent.futures.Future] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _start(self) -> None:
        """On the first structured request: the worker thread, whose first job is the tokenizer as
        llguidance sees it (about a second for a large vocabulary; off the engine thread too)."""
        if self._pool is not None:
            return
        if self._tokenizer is None:
            raise ValueError("structured_outputs: this model directory has no tokenizer (tokenizer.json), "
                             "which structured outputs need")
        if not self._eos:
            raise ValueError("structured_outputs: the model has no eos_token_id, which ends a structured output")
        import llguidance

        self._executor = llguidance.LLExecutor()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mla-grammar")
        self._ll_tokenizer = self._pool.submit(
            llguidance.LLTokenizer, self._tokenizer.to_str(), n_vocab=self.vocab_size, eos_token=self._eos)

    def grammar(self, so: StructuredOutputsParams) -> RequestGrammar:
        """A matcher for a new request; a bad spec raises here (StructuredOutputError). The
        compile against the tokenizer starts on a worker thread and is cached by grammar."""
        self._start()
        grammar = grammar_of(so)
        with self._lock:
            fut = self._compiled.get(grammar)
            if fut is None:
                fut = self._compiled[grammar] = self._pool.submit(self._compile, grammar, so.kind)
                while len(self._compiled) > _CACHE_SIZE:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(grammar)
        if fut.done():  # cached: a grammar that failed against the tokenizer fails the request now
            fut.result()
        return RequestGrammar(fut)

    def _compile(self, grammar: str, kind: str):
        import llguidance

        m = llguidance.LLMatcher(self._ll_tokenizer.result(), grammar, log_level=0)
        if m.is_error():
            raise StructuredOutputError(kind, m.get_error())
        return m

    def mask(self, logits: np.ndarray, grammars: Sequence[RequestGrammar | None],
             outputs: Sequence[Sequence[int]]) -> np.ndarray:
        """The logits [B, vocab] with each constrained row's disallowed tokens at -inf (a copy
        when any row is constrained; the array itself otherwise). outputs[b]: row b's output
        token ids, which its matcher must have consumed."""
        rows = [b for b, g in enumerate(grammars) if g is not None]
        if not rows:
            return logits
        vocab = logits.shape[1]
        if vocab != self.vocab_size:
            raise ValueError(f"logits have {vocab} columns, the grammar's vocabulary {self.vocab_size}")
        matchers = []
        for k, b in enumerate(rows):
            g = grammars[b]
            g.follow(outputs[b])
            if g.matcher is not None and not g.matcher.is_error():
                matchers.append((g.matcher, k))
        from llguidance.numpy import fill_next_token_bitmask_par

        bitmask = np.zeros((len(rows), (vocab + 31) // 32), np.int32)
        if matchers:
            fill_next_token_bitmask_par(self._executor, matchers, bitmask)
        allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, count=vocab, bitorder="little").view(bool)
        # A request whose grammar failed (compile or matcher error) may draw only eos, which its
        # `accept` then refuses: the engine ends it with the error, no NaN row reaches the sampler.
        allowed[~allowed.any(axis=1), self._eos[0]] = True
        out = np.array(logits, dtype=np.float32, copy=True)
        sub = out[rows]
        sub[~allowed] = -np.inf
        out[rows] = sub
        return out
