"""The routers living in this process (for the ingress's per-replica metrics), and the calls
this process's client has running on each replica (for the routers' load).

Its own module because Ray Serve ships the router class *by value* (cloudpickle), together
with the globals its code names: a registry kept in router.py would be a copy per router.
The router imports this module at run time, which resolves to the one imported here.
"""

from __future__ import annotations

import threading
import time
import weakref

__all__ = ["register", "routing_stats_by_replica", "picked", "call_started", "call_ended", "load"]

_ROUTERS: weakref.WeakSet = weakref.WeakSet()
_LOCK = threading.Lock()
_RUNNING: dict[str, int] = {}  # replica unique id -> calls accepted there and not ended
_PICKS: dict[str, tuple[str, float]] = {}  # Ray Serve request id -> (replica picked, when), until accepted
PICK_TTL_S = 5.0  # a pick no replica accepted by then (rejected, cancelled while routed) stops counting


def picked(request_id: str, replica: str) -> None:
    """The router chose `replica` for a call (once per call)."""
    with _LOCK:
        _PICKS.setdefault(request_id, (replica, time.monotonic()))


def call_started(replica: str) -> None:
    """A call was accepted by `replica`: it counts as running there instead of as a pick."""
    with _LOCK:
        oldest = min((k for k, (r, _) in _PICKS.items() if r == replica), key=lambda k: _PICKS[k][1], default=None)
        if oldest is not None:
            del _PICKS[oldest]
        _RUNNING[replica] = _RUNNING.get(replica, 0) + 1


def call_ended(replica: str) -> None:
    with _LOCK:
        n = _RUNNING.get(replica, 0) - 1
        if n > 0:
            _RUNNING[replica] = n
        else:
            _RUNNING.pop(replica, None)


def load(replica: str) -> int:
    """Calls this process has running on `replica` plus the ones its routers picked it for that
    it has not accepted yet."""
    now = time.monotonic()
    with _LOCK:
        for k in [k for k, (_, t) in _PICKS.items() if now - t > PICK_TTL_S]:
            del _PICKS[k]
        return _RUNNING.get(replica, 0) + sum(1 for r, _ in _PICKS.values() if r == replica)


def register(router) -> None:
    with _LOCK:
        _ROUTERS.add(router)


def routing_stats_by_replica(deployment_name: str | None = None) -> dict[str, dict]:
    """The latest `record_routing_stats` of every replica the routers of this process route to
    (replica unique id -> stats)."""
    with _LOCK:
        routers = list(_ROUTERS)
    out: dict[str, dict] = {}
    for r in routers:
        dep = getattr(r, "_deployment_id", None)
        if deployment_name is not None and dep is not None and dep.name != deployment_name:
            continue
        for rid, rep in list(r.curr_replicas.items()):
            out[rid.unique_id] = dict(rep.routing_stats or {})
    return out
