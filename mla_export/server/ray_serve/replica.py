"""`EngineReplica`: one Ray Serve replica = one `LLMEngine` stepping in an `EngineLoop` thread.

`generate(call)` is a streaming method (an async generator) that admits the call's sequences,
answers "accepted" (with the address of this replica's output channel), and ends with the
replica's stats once every sequence has ended. The outputs go to the calling ingress's outbox
on the output channel (channel.py): one frame per engine step for all of that ingress's calls.
When the caller goes away (client disconnect, stop string, the ingress cancels) Ray cancels
the generator, and its `finally` aborts what is still in the engine, so the blocks come back.

`record_routing_stats` is Ray Serve's hook: the controller polls it and hands the result to the
routers (our router and the ingress's per-replica metrics read it). `check_health` fails when
the engine thread died, and Ray Serve replaces the replica. On shutdown Ray Serve waits for
running calls (graceful_shutdown_timeout_s), then `__del__` stops the engine loop.
"""

from __future__ import annotations

import logging
import os
import time

from ..engine_loop import EngineDead, EngineLoop, QueueFull, ShuttingDown
from ..metrics import ServerMetrics
from .channel import CallSink, ChannelServer
from .wire import EngineCall

__all__ = ["EngineReplica"]

log = logging.getLogger("mla_export.server")


class EngineReplica:
    async def __init__(self, out_dir: str, engine_kwargs: dict, *, max_num_seqs: int, max_queue: int, model_name: str,
                       stream_interval_s: float = 0.0):
        import ray
        from ray import serve

        from mla_export.runtime.engine import LLMEngine

        self.engine = LLMEngine(out_dir, max_num_seqs=max_num_seqs, **engine_kwargs)
        self.loop = EngineLoop(self.engine, max_num_seqs=max_num_seqs, max_queue=max_queue,
                               metrics=ServerMetrics(model_name=model_name))
        self.loop.start()
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.requests = 0
        self.channel = ChannelServer(float(stream_interval_s))
        await self.channel.start(ray.util.get_node_ip_address())

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
        if not isinstance(call, EngineCall) or not call.seqs or not call.channel:
            yield ("rejected", "invalid", "an engine call needs at least one sequence and the ingress's channel token")
            return
        box = self.channel.outbox(call.channel)
        sink = CallSink(box, [s.request_id for s in call.seqs])
        box.calls += 1
        try:
            try:
                await self.loop.submit(call.seqs, queue=sink)
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
            try:
                yield ("accepted", self.replica_id, self.channel.address)
                await sink.done.wait()
                yield ("stats", self.snapshot())
            finally:
                if sink.pending:  # cancelled by the caller: free the engine's blocks
                    self.loop.abort(sorted(sink.pending))
                    box.forget(sink.pending)
        finally:
            box.calls -= 1
            self.channel.release(call.channel)

    def record_routing_stats(self) -> dict:
        return self.snapshot()

    def check_health(self) -> None:
        if not self.loop.alive and not self.loop.stopping:
            raise RuntimeError(f"engine loop of replica {self.replica_id} is down: {self.loop.dead_reason}")

    def __del__(self):
        channel = getattr(self, "channel", None)
        if channel is not None:
            channel.close()
        loop = getattr(self, "loop", None)
        if loop is not None and not loop.stopping:
            stats = loop.stop(60.0)
            log.info("replica %s stopped: kv_blocks_used=%s", getattr(self, "replica_id", "?"),
                     stats.get("kv_blocks_used"))
