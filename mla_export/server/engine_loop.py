"""The engine stepping in its own thread, shared by every connection (continuous batching).

The `LLMEngine` is not thread-safe, so exactly one thread (this loop's) ever calls it. The
asyncio side talks to it through a command queue (add / abort / stop) and gets each request's
outputs on an `asyncio.Queue` of its own, filled from the engine thread with
`call_soon_threadsafe` (one hop per engine step, not per token). The outputs are `Delta`s
(deltas.py: what this step added, as the Ray client yields them too) and `Aborted`.

Admission: at most `max_num_seqs + max_queue` sequences are in the server at once (a request
with `n` choices counts `n`). A request that would exceed it is refused at once with
`QueueFull` (the HTTP layer answers 429) instead of waiting: the check and the reservation run
on the event loop thread, before anything is sent to the engine.

Every sequence leaves the engine exactly once: it finishes (its final output is delivered), or
it is aborted (client gone, shutdown), which calls
`engine.abort_request` and frees its blocks.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .deltas import delta_of
from .engine_client import OutputQueue
from .metrics import ServerMetrics

__all__ = ["EngineLoop", "QueueFull", "ShuttingDown", "EngineDead", "SeqRequest", "Aborted"]

log = logging.getLogger("mla_export.server")


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


class EngineDead(Exception):
    pass


@dataclass
class SeqRequest:
    """One engine request (one choice of an HTTP request)."""

    request_id: str
    prompt: Any  # str or list[int]
    params: Any  # SamplingParams
    parent: str | None = None  # the HTTP request's prompt this is one of the n choices of (metrics)


@dataclass
class Aborted:
    """Delivered for a sequence that the server ended (shutdown or engine failure)."""

    request_id: str
    reason: str
    error: str | None = None


@dataclass
class _Seq:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    num_prompt_tokens: int = 0
    num_generated: int = 0
    parent: str | None = None
    max_tokens: int | None = None


class EngineLoop:
    def __init__(self, engine, *, max_num_seqs: int, max_queue: int, metrics: ServerMetrics | None = None,
                 idle_poll_s: float = 1.0, log_requests: bool = False):
        """`log_requests`: an info line per sequence when it is received, finished or aborted (its
        id, token counts and finish reason; never the prompt)."""
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        self.engine = engine
        self.capacity = int(max_num_seqs) + int(max_queue)
        self.metrics = metrics or ServerMetrics()
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._seqs: dict[str, _Seq] = {}  # engine thread only
        self._in_flight = 0  # sequences admitted and not yet ended; guarded by _lock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dead: str | None = None
        self._idle_poll_s = idle_poll_s
        self._stats: dict = {}
        self._stopped = threading.Event()
        self._final_stats: dict | None = None
        self.log_requests = log_requests
        self._parents: dict[str, list[int]] = {}  # parent -> [choices, choices still running, most generated]

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine loop is already running")
        self._stats = self._engine_stats()
        self._thread = threading.Thread(target=self._run, name="mla-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> dict:
        """Refuse new requests, abort what is still in the engine, end the thread. Returns the
        engine's final stats (the caller checks that no block is held)."""
        self._stopping = True
        if self._thread is None:
            return self._engine_stats()
        self._cmds.put(("stop", None, None))
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("the engine thread did not stop")
        return dict(self._final_stats or self._stats)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    @property
    def dead_reason(self) -> str | None:
        return self._dead

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stats(self) -> dict:
        """The engine's stats as of the end of its latest step (a snapshot: safe from any thread)."""
        s = dict(self._stats)
        with self._lock:
            s["server_in_flight"] = self._in_flight
        s["server_capacity"] = self.capacity
        return s

    def replica_stats(self) -> dict[str, dict]:
        """No replicas: the engine runs in this process (EngineClient interface)."""
        return {}

    # ---- asyncio side ----------------------------------------------------------------------
    async def submit(self, seqs: list[SeqRequest], queue=None):
        """Add the sequences to the engine (all or none); their outputs (`Delta`, or `Aborted`)
        arrive on the one queue returned. Raises QueueFull, ShuttingDown,
        EngineDead, or the engine's own ValueError for a request it rejects.

        `queue`: where to put the outputs instead of a new `OutputQueue` (anything with
        `put_nowait`, called on this event loop; the Ray replica passes its output channel,
        which turns one engine step's outputs of every call into one message)."""
        if self._stopping:
            raise ShuttingDown()
        if self._dead is not None:
            raise EngineDead(self._dead)
        with self._lock:
            if self._in_flight + len(seqs) > self.capacity:
                raise QueueFull()
            self._in_flight += len(seqs)
        loop = asyncio.get_running_loop()
        q = OutputQueue() if queue is None else queue
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._cmds.put(("add", [(s, q, loop) for s in seqs], fut))
        try:
            await asyncio.wrap_future(fut)
        except BaseException:
            # Either the engine refused the request (it released the reservation itself), or
            # this coroutine was cancelled while waiting: if the add has not started it never
            # will (the engine thread releases the reservation); if it ran or is running, the
            # abort command queued behind it removes whatever was added.
            if not fut.done() and fut.cancel():
                pass
            elif fut.cancelled():
                pass
            elif not fut.done() or fut.exception() is None:
                self.abort([s.request_id for s in seqs])
            raise
        return q

    def abort(self, request_ids: list[str], reason: str = "abort") -> None:
        """Thread-safe and non-blocking: the engine thread aborts whichever are still running
        (`reason` is what the metrics count: "abort" for a cancelled request)."""
        if request_ids:
            self._cmds.put(("abort", list(request_ids), reason))

    # ---- engine thread ---------------------------------------------------------------------
    def _engine_stats(self) -> dict:
        try:
            return dict(self.engine.stats())
        except Exception as e:  # stats must never take the loop down
            log.warning("engine.stats() failed: %s", e)
            return dict(self._stats)

    def _end(self, rid: str) -> _Seq | None:
        seq = self._seqs.pop(rid, None)
        if seq is not None:
            with self._lock:
                self._in_flight -= 1
            entry = self._parents.get(seq.parent) if seq.parent is not None else None
            if entry is not None:
                entry[1] -= 1
                entry[2] = max(entry[2], seq.num_generated)
                if entry[1] == 0:  # every choice of the prompt ended
                    del self._parents[seq.parent]
                    self.metrics.observe_parent(entry[0], entry[2])
        return seq

    def _handle(self, cmd) -> bool:
        kind, payload, fut = cmd
        if kind == "add":
            if not fut.set_running_or_notify_cancel():  # the caller gave up before it ran
                with self._lock:
                    self._in_flight -= len(payload)
                return True
            added: list[str] = []
            try:
                if self._stopping:
                    raise ShuttingDown()
                if self._dead is not None:
                    raise EngineDead(self._dead)
                for s, q, loop in payload:
                    self.engine.add_request(s.request_id, s.prompt, s.params)
                    added.append(s.request_id)
                    self._seqs[s.request_id] = _Seq(loop=loop, queue=q, arrival=time.monotonic(), parent=s.parent,
                                                    max_tokens=getattr(s.params, "max_tokens", None))
                    if s.parent is not None:
                        entry = self._parents.setdefault(s.parent, [0, 0, 0])
                        entry[0] += 1
                        entry[1] += 1
                    if self.log_requests:
                        log.info("Received request %s: prompt tokens %s, params: %s", s.request_id,
                                 len(s.prompt) if isinstance(s.prompt, (list, tuple)) else "?", _params_text(s.params))
            except BaseException as e:
                for rid in added:  # all or none
                    self._abort_one(rid, count=False)
                with self._lock:
                    self._in_flight -= len(payload) - len(added)
                fut.set_exception(e)
                return True
            fut.set_result(None)
        elif kind == "abort":
            for rid in payload:
                self._abort_one(rid, reason=fut)
        elif kind == "stop":
            return False
        return True

    def _abort_one(self, rid: str, count: bool = True, reason: str = "abort") -> None:
        seq = self._end(rid)
        if seq is None:
            return  # already finished (or never added)
        try:
            self.engine.abort_request(rid)
        except Exception as e:
            log.warning("engine.abort_request(%s) failed: %s", rid, e)
        if count:
            self.metrics.observe_end(reason, None, seq.num_generated)
        if self.log_requests:
            log.info("Aborted request %s (%s): output tokens %d", rid, reason, seq.num_generated)

    def _deliver(self, items: list) -> None:
        by_loop: dict = collections.defaultdict(list)
        for loop, q, item in items:
            by_loop[loop].append((q, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # that event loop is closed: nobody is listening any more
                pass

    def _run(self) -> None:
        running = True
        try:
            while running:
                # Block only when the engine has nothing to do.
                block = not self._engine_busy()
                try:
                    cmd = self._cmds.get(timeout=self._idle_poll_s) if block else self._cmds.get_nowait()
                except queue.Empty:
                    cmd = None
                while cmd is not None:
                    if not self._handle(cmd):
                        running = False
                    try:
                        cmd = self._cmds.get_nowait()
                    except queue.Empty:
                        cmd = None
                if not running:
                    break
                if self._engine_busy():
                    self._step()
                else:
                    self._stats = self._engine_stats()
        finally:
            self._shutdown_engine()

    def _engine_busy(self) -> bool:
        if self._dead is not None:
            return False
        try:
            return bool(self.engine.has_unfinished_requests())
        except Exception as e:
            self._die(f"engine.has_unfinished_requests() failed: {e!r}")
            return False

    def _step(self) -> None:
        try:
            outs = self.engine.step()
        except Exception as e:
            log.exception("engine.step() failed")
            self._die(f"engine step failed: {e!r}")
            return
        now = time.monotonic()
        items = []
        new_tokens = 0
        prompt_tokens = 0  # of the prompts whose first token this step made
        for out in outs:
            seq = self._seqs.get(out.request_id)
            if seq is None:
                continue  # aborted meanwhile
            n_new = len(out.new_token_ids or ())
            new_tokens += n_new
            seq.num_generated += n_new
            if seq.first_token is None and n_new:
                seq.first_token = now
                prompt_tokens += len(out.prompt_token_ids or ())
                self.metrics.observe_ttft(now - seq.arrival)
            elif n_new and seq.last_token is not None:
                self.metrics.observe_token_gap((now - seq.last_token) / n_new)
            if n_new:
                seq.last_token = now
            if out.finish_reason == "error":  # this request failed; the engine goes on
                self._end(out.request_id)
                self.metrics.observe_end("error", None, seq.num_generated)
                items.append((seq.loop, seq.queue, Aborted(out.request_id, "error", out.error)))
                continue
            if out.finished:
                self._end(out.request_id)
                seq.num_prompt_tokens = len(out.prompt_token_ids or ())
                self.metrics.observe_end(out.finish_reason or "stop", now - seq.arrival, seq.num_generated,
                                         seq.num_prompt_tokens)
                self._observe_finished(out, seq, now)
            items.append((seq.loop, seq.queue, delta_of(out)))
        self.metrics.observe_step(now, new_tokens, prompt_tokens)
        self.metrics.observe_iteration(new_tokens + prompt_tokens)
        # The snapshot is taken before the outputs are delivered: a client that has seen its
        # final token sees stats in which that request's blocks are already released.
        self._stats = self._engine_stats()
        self._deliver(items)

    def _observe_finished(self, out, seq: _Seq, now: float) -> None:
        """vLLM's request phases from the engine's own timestamps (one clock: time.time())."""
        m = getattr(out, "metrics", None)
        arrival, sched = getattr(m, "arrival_time", None), getattr(m, "first_scheduled_time", None)
        first, last = getattr(m, "first_token_time", None), getattr(m, "finished_time", None)
        span = lambda a, b: None if a is None or b is None else b - a  # noqa: E731
        self.metrics.observe_phases(queue=span(arrival, sched), prefill=span(sched, first),
                                    decode=span(first, last), inference=span(sched, last))
        self.metrics.observe_params(seq.max_tokens)
        if self.log_requests:
            log.info("Finished request %s: prompt tokens %d, output tokens %d, finish reason %s%s, %.3f s",
                     out.request_id, seq.num_prompt_tokens, seq.num_generated, out.finish_reason,
                     _stop_reason_text(getattr(out, "stop_reason", None)),
                     now - seq.arrival)

    def _die(self, reason: str) -> None:
        """The engine failed: every request ends with an error, the server reports unhealthy."""
        self._dead = reason
        items = []
        for rid in list(self._seqs):
            seq = self._seqs[rid]
            self._abort_one(rid)
            items.append((seq.loop, seq.queue, Aborted(rid, "error", reason)))
        self._deliver(items)

    def _shutdown_engine(self) -> None:
        # Drain commands that raced with stop (adds are refused, aborts applied).
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                break
            kind, payload, fut = cmd
            if kind == "add":
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(ShuttingDown())
                with self._lock:
                    self._in_flight -= len(payload)
            elif kind == "abort":
                for rid in payload:
                    self._abort_one(rid, reason=fut)
        items = []
        for rid in list(self._seqs):
            seq = self._seqs[rid]
            self._abort_one(rid)
            items.append((seq.loop, seq.queue, Aborted(rid, "shutdown")))
        self._deliver(items)
        self._stats = self._engine_stats()
        self._final_stats = dict(self._stats)
        self._stopped.set()


def _params_text(params) -> str:
    """The sampling parameters worth a log line (stop strings counted, not shown: they may quote
    the user's text)."""
    keys = ("max_tokens", "temperature", "top_p", "top_k", "seed", "min_tokens", "logprobs")
    parts = [f"{k}={getattr(params, k)}" for k in keys if getattr(params, k, None) is not None]
    stop = getattr(params, "stop", ())
    if stop:
        parts.append(f"stop=<{len(stop)} strings>")
    return ", ".join(parts)


def _stop_reason_text(reason) -> str:
    if reason is None:
        return ""
    return f" (token {reason})" if isinstance(reason, int) else " (a stop string)"


def _put_all(batch) -> None:
    for q, item in batch:
        q.put_nowait(item)
