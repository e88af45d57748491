"""The routers living in this process, for the ingress's per-replica metrics.

Its own module because Ray Serve ships the router class *by value* (cloudpickle), together
with the globals its code names: a registry kept in router.py would be a copy per router.
The router imports this module at run time, which resolves to the one imported here.
"""

from __future__ import annotations

import threading
import weakref

__all__ = ["register", "routing_stats_by_replica"]

_ROUTERS: weakref.WeakSet = weakref.WeakSet()
_LOCK = threading.Lock()


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
