"""`PrefixAffinityRouter`: a Ray Serve `RequestRouter` that sends a prompt to the replica that
already holds its leading KV blocks.

Why our own and not `ray.serve.llm`'s `PrefixCacheAffinityRouter`: that one matches prompt
*text* character by character in a detached prefix-tree actor, reached with blocking
`ray.get` calls from the router's event loop, and `ray.serve.llm` imports pyarrow. Our
engine caches whole blocks of token ids (kv_cache.py: a block is reusable when every token
before it and in it is equal), so this router keys on exactly that: the chain hash of each
whole `block_size`-token block of the prompt, kept in the router's own process (an LRU map,
bounded), no extra actor. Each ingress process has its own map; with one ingress (the
default) that is the whole picture, with several each learns from the requests it routes.

Policy per request (one `choose_replicas` call):
1. The replicas that served the longest run of this prompt's leading blocks are the first
   rank, unless one of them is busier than the least busy replica by more than
   `imbalanced_threshold` ongoing requests (then affinity gives way to load).
2. Everyone else follows, least loaded first (Ray Serve takes the least loaded of a rank, and
   moves to the next rank when the first is at max_ongoing_requests).
A prompt no replica holds goes to the least loaded replica first. Load is the calls this
ingress's client has running on the replica (registry.py: counted when accepted, until they
end) plus the ones this router picked it for that it has not accepted yet. Not Ray Serve's own
per-replica counts: a burst of new streams is routed before any of those come back, and on
them the whole burst landed on one replica.
A call without prompt ids (`describe`) goes to any replica.

Per-replica stats (the replicas' `record_routing_stats`, delivered to routers by the Ray
Serve controller) are also what the ingress's /metrics shows (registry.py).
"""

from __future__ import annotations

import collections
import random

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

__all__ = ["PrefixAffinityRouter", "block_chain"]

def block_chain(ids: list[int], block_size: int) -> list[int]:
    """One hash per whole block: hash k covers tokens [0, (k+1) * block_size), as the engine's
    prefix cache keys a block by everything before it and in it."""
    out, h = [], 0
    for k in range(len(ids) // block_size):
        h = hash((h, tuple(ids[k * block_size:(k + 1) * block_size])))
        out.append(h)
    return out


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, block_size: int = 16, imbalanced_threshold: int = 4, max_entries: int = 200_000):
        if block_size < 1 or imbalanced_threshold < 0 or max_entries < 1:
            raise ValueError(f"PrefixAffinityRouter: block_size ({block_size}) and max_entries ({max_entries}) "
                             f"must be >= 1, imbalanced_threshold ({imbalanced_threshold}) >= 0")
        self._block_size = int(block_size)
        self._imbalanced_threshold = int(imbalanced_threshold)
        self._max_entries = int(max_entries)
        self._owners: collections.OrderedDict[int, set[ReplicaID]] = collections.OrderedDict()
        import mla_export.server.ray_serve.registry as registry  # by reference: see registry.py

        registry.register(self)

    def _prompt_chain(self, pending_request: PendingRequest | None) -> list[int]:
        if pending_request is None or not pending_request.args:
            return []
        ids = getattr(pending_request.args[0], "prompt_ids", None)
        return block_chain(ids, self._block_size) if ids else []

    def _load(self, r: RunningReplica) -> int:
        """Calls on the replica: those this process's client has running there (exact, as they
        are accepted and end) plus those the router picked it for that it has not accepted yet
        (registry.py). Not Ray Serve's own count: a burst of calls is routed before any of its
        counts come back, and on those the whole burst went to one replica."""
        import mla_export.server.ray_serve.registry as registry  # by reference: see registry.py

        return registry.load(r.replica_id.unique_id)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        chain = self._prompt_chain(pending_request)
        if len(candidate_replicas) < 2 or pending_request is None or not pending_request.args:
            return [random.sample(candidate_replicas, len(candidate_replicas))]
        by_id = {r.replica_id: r for r in candidate_replicas}
        best: set[ReplicaID] = set()
        for h in chain:  # the longest run of leading blocks some candidate holds
            owners = {rid for rid in self._owners.get(h, ()) if rid in by_id}
            if not owners:
                break
            best = owners
        if not best:
            return self._by_load(candidate_replicas, pending_request)
        least = min(self._load(r) for r in candidate_replicas)
        first = [by_id[rid] for rid in best if self._load(by_id[rid]) - least <= self._imbalanced_threshold]
        if not first:
            return self._by_load(candidate_replicas, pending_request)
        rest = [r for r in candidate_replicas if r.replica_id not in best]
        return [first, *self._by_load(rest, None)] if rest else [first]  # affinity first: nothing to count

    def _by_load(self, replicas: list[RunningReplica], pending_request: PendingRequest | None) -> list[list[RunningReplica]]:
        """Ranks: the least loaded replica (ties broken at random), then the others by load.
        The pick counts as load at once (once per call: Ray Serve asks again while it probes)."""
        import mla_export.server.ray_serve.registry as registry  # by reference: see registry.py

        loads = {r.replica_id: self._load(r) for r in replicas}
        order = sorted(replicas, key=lambda r: (loads[r.replica_id], random.random()))
        key = getattr(getattr(pending_request, "metadata", None), "internal_request_id", None)
        if key is not None:
            registry.picked(key, order[0].replica_id.unique_id)
        return [[order[0]], order[1:]] if len(order) > 1 else [[order[0]]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        for h in self._prompt_chain(pending_request):
            owners = self._owners.get(h)
            if owners is None:
                owners = self._owners[h] = set()
            else:
                self._owners.move_to_end(h)
            owners.add(replica_id)
        while len(self._owners) > self._max_entries:
            self._owners.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID):
        super().on_replica_actor_died(replica_id)
        for owners in self._owners.values():  # its cache died with it
            owners.discard(replica_id)
