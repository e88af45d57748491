"""`mla-export serve OUT_DIR --replicas N`: the same OpenAI server on Ray Serve, N engine replicas.

Two deployments in one Ray Serve application:

- `OpenAIIngress` (deployments.py): the HTTP request handling of `mla-export serve` itself
  (`mla_export.server.app.build_app`: routes, SSE, errors, API key, metrics), whose
  `EngineClient` is a `RayEngineClient` (client.py) instead of an in-process engine thread.
- `MLAEngine` (replica.py): one `LLMEngine` + `EngineLoop` per replica, streaming outputs back.

Requests reach a replica through `PrefixAffinityRouter` (router.py), a Ray Serve
`RequestRouter`: prompts whose leading KV blocks a replica already computed go back to it
unless that replica is clearly busier. See docs/RAY.md.
"""

from __future__ import annotations

__all__ = ["build_application"]


def __getattr__(name: str):
    if name == "build_application":
        from .deployments import build_application

        return build_application
    raise AttributeError(f"module 'mla_export.server.ray_serve' has no attribute {name!r}")
