"""The Ray Serve settings this application runs with (environment variables Ray Serve reads at
import time in its controller and replica processes), and why.

Measured with the tiny model on 2 cores (docs/RAY.md): through Ray Serve's HTTP proxy every SSE
chunk of every stream was a streamed object ingress -> proxy, and the proxy process cost about
as much CPU as the engine. With direct ingress the `OpenAIIngress` replica runs the HTTP
server itself (uvicorn, as `mla-export serve` does): the client talks to it with no hop in
between. Ray Serve keeps its proxy on the head node (on another port), idle.

`serve_env(port)` is what `mla-export serve --replicas` puts in the environment before it starts
the local cluster (every Ray process inherits it) and in the deployments' runtime_env (so the
replicas have it on a cluster started elsewhere). On a cluster started with `ray start`, the
controller's part (direct ingress, the port) must be in the environment of `ray start` on the
head node: docs/RAY.md shows the command.
"""

from __future__ import annotations

__all__ = ["serve_env", "CONTROLLER_KEYS"]


def serve_env(http_port: int) -> dict[str, str]:
    if not 1 <= int(http_port) <= 65534:
        raise ValueError(f"http_port must be in 1..65534, got {http_port}")
    return {
        # The ingress replica serves HTTP itself (no proxy hop per SSE chunk) ...
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        # ... on exactly the public port (Ray Serve allocates ingress ports from [MIN, MAX)).
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(int(http_port)),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(int(http_port) + 1),
        # No external load balancer has to deregister the ingress before it drains (the
        # default holds a stopping ingress open 30 s); running streams still finish.
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
        # A restarted ingress may take the one port back at once.
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        # User code and the handle's router on the replica's own event loop: no thread hop
        # (and GIL hand-off) per message.
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    }


# Read by the Serve controller (not by replicas): on an existing cluster they must be in the
# environment the head node was started with.
CONTROLLER_KEYS = ("RAY_SERVE_ENABLE_DIRECT_INGRESS", "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT",
                   "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S",
                   "RAY_SERVE_PORT_QUARANTINE_S")
