"""`RayEngineClient`: the `EngineClient` of the Ray ingress: sequences go to the engine replicas
through a Ray Serve deployment handle (routed by `PrefixAffinityRouter`), outputs come back on
the `OutputQueue` the HTTP handlers read, exactly as from an in-process `EngineLoop`.

Each call is a Ray Serve streaming call whose stream says only "accepted" (naming the replica
and its output channel) and, at the end, the replica's stats; the outputs arrive on the one
output channel per replica (channel.py), a frame per engine step for all calls, and are
handed to each call's queue here as they came: `Delta`s, the item the in-process engine loop
yields too (deltas.py).

Admission: the client counts the sequences in flight against the sum of the replicas'
capacities (QueueFull -> 429 as in `mla-export serve`); each replica still checks its own.

Faults: a call whose replica dies before it accepted is sent again (nothing was generated,
so a retry is invisible; Ray Serve routes it to a live replica); a replica that dies after
accepting ends only its calls' sequences, each with an `Aborted(reason="error")` (the HTTP
layer sends it as one SSE error event): its call streams fail and its channel closes,
whichever is noticed first. Cancelling (abort, disconnect) cancels the call's
stream, which aborts its sequences in the replica's engine.

Metrics: time to first token, token gaps and ends are observed here, at the ingress (so they
include the hop to the replica); the engine gauges are the replicas' stats, summed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

from ..engine_client import OutputQueue
from ..engine_loop import Aborted, EngineDead, QueueFull, ShuttingDown
from ..metrics import ServerMetrics
from .channel import ChannelReader
from . import registry
from .registry import routing_stats_by_replica
from .wire import EngineCall

__all__ = ["RayEngineClient"]

log = logging.getLogger("mla_export.server")

_SUMMED = ("kv_blocks_total", "kv_blocks_used", "kv_blocks_free", "num_running", "num_waiting",
           "prefix_cache_queries", "prefix_cache_hits", "num_preemptions")
ACCEPT_ATTEMPTS = 4  # a call whose replica died before accepting is re-routed this many times


@dataclass
class _Call:
    ids: set[str]  # its sequences not yet ended
    n: int  # its sequences, counted against the capacity until the call ends
    rids: tuple  # all its sequences
    arrival: float
    q: OutputQueue
    task: asyncio.Task | None = None
    replica: str | None = None  # once accepted
    aborted: set[str] = field(default_factory=set)
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    generated: dict[str, int] = field(default_factory=dict)  # output tokens so far, by sequence (metrics)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set once `ids` is empty


class RayEngineClient:
    def __init__(self, handle, *, capacity: int, metrics: ServerMetrics, deployment_name: str):
        self.handle = handle.options(stream=True)
        self.capacity = int(capacity)
        self.metrics = metrics
        self.deployment_name = deployment_name
        self._calls: dict[int, _Call] = {}
        self._by_seq: dict[str, int] = {}
        self._in_flight = 0
        self._stopping = False
        self._snapshots: dict[str, dict] = {}  # replica -> its latest stats (from a call's end)
        self._lock = threading.Lock()  # stats() runs in the metrics handler, snapshots in pumps
        self._next = 0
        self._token = secrets.token_hex(16)  # names this ingress to the replicas' output channels
        self._channels: dict[str, ChannelReader] = {}  # replica id -> its output channel

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        pass  # the replicas run already (Ray Serve started them before the ingress)

    def stop(self, timeout: float | None = None) -> dict:
        """Refuse new calls and cancel the running ones (Ray Serve has already waited for them
        up to the ingress's graceful_shutdown_timeout_s)."""
        self._stopping = True
        for call in list(self._calls.values()):
            if call.task is not None:
                call.task.get_loop().call_soon_threadsafe(call.task.cancel)
        for ch in list(self._channels.values()):
            ch.task.get_loop().call_soon_threadsafe(ch.close)
        return self.stats()

    @property
    def alive(self) -> bool:
        return any(s.get("up") for s in self.replica_stats().values()) or not self._snapshots

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def dead_reason(self) -> str | None:
        return None if self.alive else "no engine replica is up"

    # ---- stats -------------------------------------------------------------------------------
    def replica_stats(self) -> dict[str, dict]:
        """Latest stats per replica: the newer of the routers' view (controller-polled) and the
        snapshot each call brings back at its end; a replica the routers no longer list is down."""
        live = routing_stats_by_replica(self.deployment_name)
        with self._lock:
            out = {k: dict(v) for k, v in self._snapshots.items()}
        for rid, s in live.items():
            if s and (rid not in out or s.get("t", 0) >= out[rid].get("t", 0)):
                out[rid] = dict(s)
            out.setdefault(rid, {}).setdefault("up", 1)  # listed by the routers, not polled yet
        if live:
            for rid, s in out.items():
                if rid not in live:
                    s["up"] = 0
        return out

    def stats(self) -> dict:
        total = {k: 0 for k in _SUMMED}
        for s in self.replica_stats().values():
            if s.get("up"):
                for k in _SUMMED:
                    total[k] += int(s.get(k, 0) or 0)
        spec = [s for s in self.replica_stats().values() if s.get("up") and "spec_decode_num_drafts" in s]
        if spec:  # replicas that speculate: vLLM's spec-decode counters summed (per position too)
            for k in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens"):
                total[k] = sum(int(s.get(k, 0) or 0) for s in spec)
            per_pos = [s.get("spec_decode_num_accepted_tokens_per_pos") or [] for s in spec]
            total["spec_decode_num_accepted_tokens_per_pos"] = [
                sum(p[i] for p in per_pos if i < len(p)) for i in range(max(map(len, per_pos)))]
        total["server_in_flight"] = self._in_flight
        total["server_capacity"] = self.capacity
        total["num_replicas_up"] = sum(1 for s in self.replica_stats().values() if s.get("up"))
        return total

    # ---- calls -------------------------------------------------------------------------------
    async def submit(self, seqs: list) -> asyncio.Queue:
        if self._stopping:
            raise ShuttingDown()
        if self._in_flight + len(seqs) > self.capacity:
            raise QueueFull()
        self._in_flight += len(seqs)
        key = self._next = self._next + 1
        call = _Call(ids={s.request_id for s in seqs}, n=len(seqs), rids=tuple(s.request_id for s in seqs),
                     arrival=time.monotonic(), q=OutputQueue())
        # Registered before the call is sent: its first outputs may come on a channel that is
        # already open before the call's "accepted" is read.
        self._calls[key] = call
        for s in seqs:
            self._by_seq[s.request_id] = key
        try:
            gen, replica, address = await self._accepted(EngineCall(list(seqs), self._token))
        except BaseException:
            self._finish(key, call)
            raise
        call.replica = call.q.served_by = replica
        registry.call_started(replica)  # the routers' load (router.py)
        self._open_channel(replica, address)
        call.task = asyncio.ensure_future(self._pump(key, call, gen))
        return call.q

    async def _accepted(self, ec: EngineCall):
        from ray.exceptions import ActorUnavailableError, RayActorError

        for attempt in range(ACCEPT_ATTEMPTS):
            gen = self.handle.generate.remote(ec)
            try:
                kind, a, b = await gen.__anext__()
            except (RayActorError, ActorUnavailableError) as e:
                log.warning("engine replica failed before accepting (attempt %d): %s", attempt + 1, e)
                gen.cancel()
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            except StopAsyncIteration:
                raise EngineDead("the engine replica ended the call without an answer") from None
            if kind == "accepted":
                return gen, a, b
            if kind == "rejected":
                if a == "queue_full":
                    raise QueueFull()
                if a == "shutting_down":
                    raise ShuttingDown()
                if a == "engine_dead":
                    raise EngineDead(b)
                raise ValueError(b)
            raise EngineDead(f"unexpected first message from an engine replica: {kind!r}")
        raise EngineDead(f"no engine replica accepted the request after {ACCEPT_ATTEMPTS} attempts")

    # ---- output channels ---------------------------------------------------------------------
    def _open_channel(self, replica: str, address: str) -> None:
        if replica not in self._channels and not self._stopping:
            self._channels[replica] = ChannelReader(
                address, self._token, self._on_items,
                lambda reason, replica=replica: self._on_channel_closed(replica, reason))

    def _on_items(self, items: list) -> None:
        """One frame: one engine step's outputs of this ingress's calls on one replica."""
        by_call: dict[int, list] = {}
        for it in items:
            key = self._by_seq.get(it.request_id)
            if key is not None:
                by_call.setdefault(key, []).append(it)
        for key, its in by_call.items():
            call = self._calls.get(key)
            if call is not None:
                self._deliver(call, its)

    def _deliver(self, call: _Call, items: list) -> None:
        """The items go to the call's queue as they came (the deltas the local engine loop yields
        too: the HTTP layer keeps the tokens and text)."""
        self._observe(call, items)
        for item in items:
            if item.request_id in call.aborted:
                continue
            if isinstance(item, Aborted) or item.finished:
                call.ids.discard(item.request_id)
            call.q.put_nowait(item)
        if not call.ids - call.aborted:
            call.ended.set()

    def _on_channel_closed(self, replica: str, reason: str) -> None:
        self._channels.pop(replica, None)
        if self._stopping:
            return
        for call in list(self._calls.values()):
            if call.replica == replica:
                self._fail(call, f"engine replica {replica} failed: its output channel closed ({reason})")
                if call.task is not None:
                    call.task.cancel()  # and the call (if the replica still runs it, it aborts there)

    def _fail(self, call: _Call, reason: str) -> None:
        """End the call's unfinished sequences with an error (the replica died or broke)."""
        for rid in sorted(call.ids - call.aborted):
            self.metrics.observe_end("error", None, 0)
            call.q.put_nowait(Aborted(rid, "error", reason))
        call.ids.clear()
        call.ended.set()

    async def _pump(self, key: int, call: _Call, gen) -> None:
        """The call's control stream: ends with the replica's stats once every sequence ended
        there; the outputs themselves come on the channel (which may still be delivering)."""
        try:
            async for msg in gen:
                if msg[0] == "stats":
                    with self._lock:
                        self._snapshots[call.replica] = dict(msg[1])
            await call.ended.wait()
        except asyncio.CancelledError:
            gen.cancel()
        except Exception as e:  # the replica died or failed mid-call: only this call's sequences end
            log.warning("engine replica %s failed during a call: %s", call.replica, e)
            self._fail(call, f"engine replica {call.replica} failed: {type(e).__name__}")
        finally:
            self._finish(key, call)

    def _observe(self, call: _Call, items: list) -> None:
        now = time.monotonic()
        new_tokens = 0
        prompt_tokens = 0  # counted when the sequence finishes: only the finishing delta carries it
        for it in items:
            if isinstance(it, Aborted):
                continue
            n_new = len(it.new_token_ids or ())
            new_tokens += n_new
            rid = it.request_id
            call.generated[rid] = call.generated.get(rid, 0) + n_new
            if n_new and rid not in call.first:
                call.first[rid] = now
                self.metrics.observe_ttft(now - call.arrival)
            elif n_new and rid in call.last:
                self.metrics.observe_token_gap((now - call.last[rid]) / n_new)
            if n_new:
                call.last[rid] = now
            if it.finished:
                self.metrics.observe_end(it.finish_reason or "stop", now - call.arrival, call.generated[rid],
                                         it.num_prompt_tokens)
                prompt_tokens += it.num_prompt_tokens
        self.metrics.observe_step(now, new_tokens, prompt_tokens)

    def _finish(self, key: int, call: _Call) -> None:
        if self._calls.pop(key, None) is None:
            return
        if call.replica is not None:
            registry.call_ended(call.replica)
        for rid in call.rids:
            if self._by_seq.get(rid) == key:
                del self._by_seq[rid]
        self._in_flight -= call.n

    def abort(self, request_ids: list[str], reason: str = "abort") -> None:
        """Ends the named sequences for the caller; the call's stream is cancelled (which aborts
        in the replica's engine) once none of its sequences is wanted any more."""
        for rid in request_ids:
            key = self._by_seq.get(rid)
            call = self._calls.get(key) if key is not None else None
            if call is None:
                continue
            if rid in call.ids and rid not in call.aborted and reason != "stop":
                self.metrics.observe_end(reason, None, 0)
            call.aborted.add(rid)
            if call.ids <= call.aborted and call.task is not None and not call.task.done():
                call.task.cancel()

