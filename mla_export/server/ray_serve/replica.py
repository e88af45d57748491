"""`EngineReplica`: one Ray Serve replica = one `LLMEngine` stepping in an `EngineLoop` thread.

`generate(call)` is a streaming method (an async generator): it admits the call's sequences,
then yields their outputs as the engine produces them. When the caller goes away (client
disconnect, stop string, the ingress cancels) Ray cancels the generator, and its `finally`
aborts what is still in the engine, so the blocks come back.

`record_routing_stats` is Ray Serve's hook: the controller polls it and hands the result to the
routers (our router and the ingress's per-replica metrics read it). `check_health` fails when
the engine thread died, and Ray Serve replaces the replica. On shutdown Ray Serve waits for
running calls (graceful_shutdown_timeout_s), then `__del__` stops the engine loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from ..engine_loop import Aborted, EngineDead, EngineLoop, QueueFull, ShuttingDown
from ..metrics import ServerMetrics
from .wire import EngineCall, delta_of

__all__ = ["EngineReplica"]

log = logging.getLogger("mla_export.server")


class EngineReplica:
    def __init__(self, out_dir: str, engine_kwargs: dict, *, max_num_seqs: int, max_queue: int, model_name: str,
                 stream_interval_s: float = 0.0):
        from ray import serve

        from mla_export.runtime.engine import LLMEngine

        self.engine = LLMEngine(out_dir, max_num_seqs=max_num_seqs, **engine_kwargs)
        self.loop = EngineLoop(self.engine, max_num_seqs=max_num_seqs, max_queue=max_queue,
                               metrics=ServerMetrics(model_name=model_name))
        self.loop.start()
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.requests = 0
        self.stream_interval_s = float(stream_interval_s)

    def describe(self) -> dict:
        """What the ingress needs before it serves: the context length this replica's cache
        holds and its admission capacity."""
        return {"max_model_len": self.engine.max_model_len, "capacity": self.loop.capacity,
                "block_size": self.engine.facts.block_size, "replica": self.replica_id}

    def snapshot(self) -> dict:
        s = self.loop.stats()
        s.update(requests=self.requests, pid=os.getpid(), up=1 if self.loop.alive else 0, t=time.time(),
                 replica=self.replica_id)
        return s

    async def generate(self, call: EngineCall):
        if not isinstance(call, EngineCall) or not call.seqs:
            yield ("rejected", "invalid", "an engine call needs at least one sequence")
            return
        try:
            q = await self.loop.submit(call.seqs)
        except QueueFull:
            yield ("rejected", "queue_full", f"replica {self.replica_id} is at capacity")
            return
        except ShuttingDown:
            yield ("rejected", "shutting_down", f"replica {self.replica_id} is shutting down")
            return
        except EngineDead as e:
            yield ("rejected", "engine_dead", str(e))
            return
        except ValueError as e:  # the engine's own validation of the request
            yield ("rejected", "invalid", str(e))
            return
        self.requests += 1
        pending = {s.request_id for s in call.seqs}
        try:
            yield ("accepted", self.replica_id, None)
            sent_any = False
            while pending:
                items = [await q.get()]
                while not q.empty():
                    items.append(q.get_nowait())
                if sent_any and self.stream_interval_s > 0:
                    # Coalesce steps into one message (the first one goes at once: TTFT):
                    # each message costs a hop to the ingress and one more to the proxy.
                    await self._gather_for(q, items)
                sent_any = True
                for it in items:
                    if isinstance(it, Aborted) or it.finished:
                        pending.discard(it.request_id)
                yield ("out", [it if isinstance(it, Aborted) else delta_of(it) for it in items])
            yield ("stats", self.snapshot())
        finally:
            if pending:  # cancelled by the caller: free the engine's blocks
                self.loop.abort(sorted(pending))

    async def _gather_for(self, q, items: list) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stream_interval_s
        while not any(isinstance(it, Aborted) or it.finished for it in items):
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                items.append(await asyncio.wait_for(q.get(), left))
            except asyncio.TimeoutError:
                return
            while not q.empty():
                items.append(q.get_nowait())

    def record_routing_stats(self) -> dict:
        return self.snapshot()

    def check_health(self) -> None:
        if not self.loop.alive and not self.loop.stopping:
            raise RuntimeError(f"engine loop of replica {self.replica_id} is down: {self.loop.dead_reason}")

    def __del__(self):
        loop = getattr(self, "loop", None)
        if loop is not None and not loop.stopping:
            stats = loop.stop(60.0)
            log.info("replica %s stopped: kv_blocks_used=%s", getattr(self, "replica_id", "?"),
                     stats.get("kv_blocks_used"))
