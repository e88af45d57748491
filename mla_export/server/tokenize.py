"""Heavy request work for the server, kept off the event loop: JSON parsing of big bodies and
prompt tokenization.

`tokenizers`' `encode` holds the GIL for the whole call (measured here: a 16 MiB prompt takes
about 100 s on the tiny preset's byte-level BPE, and a thread running it stalled a 10 ms sleep
on the event loop for 2 s), so a thread does not help. Instead:
- a prompt too long to fit the context whatever it tokenizes to is refused at once: a token
  covers at most `max_token_chars` characters of text (the longest vocabulary entry, times 4 for
  normalizers that expand text), so more than max_model_len * that many characters cannot fit;
- a short prompt (under `inline_chars`) is encoded inline (microseconds to a few ms);
- anything else goes to one worker process (spawned at start-up, never forked from the server
  with its OpenVINO threads), which returns the ids as int32 bytes.
json.loads holds the GIL too (a 16 MiB body took 0.57 s here), so bodies over `inline_bytes` are
parsed in the same worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading

import numpy as np

__all__ = ["PromptEncoder", "PromptTooLong"]

_worker_tokenizer = None


def _init_worker(path: str | None) -> None:
    global _worker_tokenizer
    if path is not None:
        from tokenizers import Tokenizer

        _worker_tokenizer = Tokenizer.from_file(path)


def _ping() -> bool:
    return True


def _parse_in_worker(raw) -> tuple:
    from .api_error import APIError
    from .protocol import parse_json_body

    try:
        return "ok", parse_json_body(raw)
    except APIError as e:
        return "error", e.status, e.body()


def _encode_in_worker(text: str, special: bool) -> bytes:
    ids = _worker_tokenizer.encode(text, add_special_tokens=special).ids
    return np.asarray(ids, dtype=np.int32).tobytes()


class PromptTooLong(ValueError):
    pass


class PromptEncoder:
    def __init__(self, tokenizer, tokenizer_path: str | None, max_model_len: int | None,
                 inline_chars: int = 64 << 10, inline_bytes: int = 1 << 20):
        self.tokenizer = tokenizer
        self.path = tokenizer_path
        self.inline_chars = inline_chars
        self.inline_bytes = inline_bytes
        self.char_limit = None
        if tokenizer is not None and max_model_len is not None:
            longest = max((len(t) for t in tokenizer.get_vocab(with_added_tokens=True)), default=1)
            self.char_limit = int(max_model_len) * max(1, longest) * 4
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _worker(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker, initargs=(self.path,))  # path None: JSON only
            return self._pool

    def start(self) -> None:
        """Spawn the worker now (a spawn blocks its caller for a while: not on the event loop)."""
        self._worker().submit(_ping).result()

    async def parse_json(self, raw):
        """parse_json_body(raw), in the worker when raw is big."""
        from . import protocol as P

        if len(raw) <= self.inline_bytes:
            return P.parse_json_body(bytes(raw))
        result = await asyncio.get_running_loop().run_in_executor(self._worker(), _parse_in_worker, raw)
        if result[0] == "ok":
            return result[1]
        err = result[2]["error"]
        raise P.APIError(result[1], err["message"], param=err.get("param"), code=err.get("code"))

    async def encode(self, text: str, *, special: bool, max_tokens: int | None = None) -> list[int]:
        """Token ids of text. Raises PromptTooLong (before tokenizing when the length alone rules
        it out) when it has more than max_tokens ids."""
        if self.char_limit is not None and len(text) > self.char_limit:
            raise PromptTooLong(f"the prompt has {len(text)} characters: more tokens than the model's context "
                                f"({max_tokens} tokens) whatever it tokenizes to")
        if len(text) <= self.inline_chars:
            ids = np.asarray(self.tokenizer.encode(text, add_special_tokens=special).ids, dtype=np.int32)
        elif self.path is not None:
            loop = asyncio.get_running_loop()
            raw = await loop.run_in_executor(self._worker(), _encode_in_worker, text, special)
            ids = np.frombuffer(raw, dtype=np.int32)
        else:  # no file to load in a worker: a thread at least keeps the loop scheduling
            ids = np.asarray((await asyncio.to_thread(self.tokenizer.encode_batch, [text], special))[0].ids,
                             dtype=np.int32)
        if max_tokens is not None and ids.size > max_tokens:
            raise PromptTooLong(f"the prompt has {ids.size} tokens, more than the model's context ({max_tokens})")
        return ids.tolist()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            for p in list(getattr(pool, "_processes", {}).values()):  # a worker may be mid-prompt
                p.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
