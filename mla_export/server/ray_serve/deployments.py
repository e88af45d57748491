"""The Ray Serve application: `OpenAIIngress` (HTTP, our request handling) -> `MLAEngine`
replicas (`EngineReplica`), routed by `PrefixAffinityRouter`.

    from ray import serve
    from mla_export.server.ray_serve import build_application
    serve.run(build_application("out/tiny", replicas=2), name="mla-export", route_prefix="/")

`build_application` is also the import path for a `serve run` / `serve deploy` config
(docs/RAY.md): `import_path: mla_export.server.ray_serve.deployments:app_builder`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ray import serve
from ray.serve.config import RequestRouterConfig

from ..app import build_app
from ..engine_client import ModelView
from ..metrics import ServerMetrics
from ..state import ServerState
from .client import RayEngineClient
from .flags import serve_env
from .replica import EngineReplica
from .router import PrefixAffinityRouter

__all__ = ["build_application", "app_builder", "RaySettings", "ENGINE_DEPLOYMENT", "INGRESS_DEPLOYMENT"]

log = logging.getLogger("mla_export.server")
# No access log line per Ray Serve call (one per engine call between the replicas: noise, not
# the client's HTTP requests); warnings and errors are still logged.
_LOGGING = {"enable_access_log": False}
ENGINE_DEPLOYMENT = "MLAEngine"
INGRESS_DEPLOYMENT = "OpenAIIngress"


@dataclass
class RaySettings:
    """Everything `mla-export serve --replicas N` passes to the deployments (plain data: Ray
    ships it to the replicas' processes)."""

    out_dir: str
    model_name: str
    replicas: int = 2
    api_key: str | None = None
    chat_template: str | None = None
    generation_config: str = "auto"  # vLLM's --generation-config: auto | vllm | a directory
    max_num_seqs: int = 64
    max_queue: int = 256
    engine_kwargs: dict = field(default_factory=dict)  # LLMEngine's keyword arguments
    replica_cpus: float = 1.0  # Ray logical CPUs reserved per engine replica
    autoscaling: dict | None = None  # Ray Serve autoscaling_config of the engine (instead of `replicas`)
    shutdown_timeout_s: float = 30.0
    imbalanced_threshold: int = 4  # calls: more than this above the least busy replica ends affinity
    routing_stats_period_s: float = 1.0
    stream_interval_s: float = 0.0  # > 0: a replica sends a stream's later outputs at most this often (coalesced)
    http_port: int | None = None  # direct ingress on this port (flags.py); None: behind Ray Serve's proxy
    ingress_node_ip: str | None = None  # pin the ingress (the HTTP endpoint) to this Ray node
    parsers: dict = field(default_factory=dict)  # ServerState's tool_call_parser, enable_auto_tool_choice, reasoning_parser

    def actor_options(self, **kw) -> dict:
        """ray_actor_options of a deployment: with direct ingress, Ray Serve's flags in its runtime_env."""
        if self.http_port is not None:
            kw["runtime_env"] = {"env_vars": serve_env(self.http_port)}
        return kw

    @property
    def replica_capacity(self) -> int:
        return self.max_num_seqs + self.max_queue


@serve.ingress()
class OpenAIIngress:
    """The HTTP side: `build_app` over a `RayEngineClient` of the engine deployment."""

    async def __init__(self, engine, settings: dict):
        s = RaySettings(**settings)
        info = await engine.describe.remote()
        n = s.autoscaling.get("max_replicas", s.replicas) if s.autoscaling else s.replicas
        metrics = ServerMetrics(model_name=s.model_name)
        client = RayEngineClient(engine, capacity=n * info["capacity"], metrics=metrics,
                                 deployment_name=ENGINE_DEPLOYMENT)
        verify = s.engine_kwargs.get("verify")  # the replicas did the full check, if asked for
        model = ModelView.of_export(s.out_dir, info["max_model_len"], "sampled" if verify == "full" else verify)
        self.state = ServerState(client, model, metrics, model_name=s.model_name, api_key=s.api_key,
                                 chat_template=s.chat_template, generation_config=s.generation_config,
                                 **s.parsers)

    def __serve_build_asgi_app__(self):
        return build_app(self.state)


def build_application(settings: RaySettings):
    """The bound application (pass it to `serve.run`)."""
    if not Path(settings.out_dir, "mla_graph.json").is_file():
        raise FileNotFoundError(f"{settings.out_dir}: not an export directory (no mla_graph.json)")
    from mla_export.runtime.model_dir import load_model_dir

    # A quick check here (before Ray starts); a full one is the replicas' (each reads its node's copy).
    verify = settings.engine_kwargs.get("verify")
    _, facts = load_model_dir(settings.out_dir, "sampled" if verify == "full" else verify)
    scale = ({"autoscaling_config": dict(settings.autoscaling)} if settings.autoscaling
             else {"num_replicas": settings.replicas})
    engine = serve.deployment(EngineReplica).options(
        name=ENGINE_DEPLOYMENT,
        max_ongoing_requests=settings.replica_capacity,
        ray_actor_options=settings.actor_options(num_cpus=settings.replica_cpus),
        graceful_shutdown_timeout_s=settings.shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=0.5,
        health_check_period_s=2.0,
        logging_config=_LOGGING,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"block_size": facts.block_size,
                                   "imbalanced_threshold": settings.imbalanced_threshold},
            request_routing_stats_period_s=settings.routing_stats_period_s),
        **scale,
    ).bind(settings.out_dir, dict(settings.engine_kwargs), max_num_seqs=settings.max_num_seqs,
           max_queue=settings.max_queue, model_name=settings.model_name,
           stream_interval_s=settings.stream_interval_s)
    max_replicas = settings.autoscaling.get("max_replicas", settings.replicas) if settings.autoscaling else settings.replicas
    ingress = serve.deployment(OpenAIIngress).options(
        name=INGRESS_DEPLOYMENT, num_replicas=1,
        ray_actor_options=settings.actor_options(num_cpus=0, **(
            {"resources": {f"node:{settings.ingress_node_ip}": 0.001}} if settings.ingress_node_ip else {})),
        max_ongoing_requests=max_replicas * settings.replica_capacity + 64,
        graceful_shutdown_timeout_s=settings.shutdown_timeout_s, graceful_shutdown_wait_loop_s=0.5,
        logging_config=_LOGGING)
    return ingress.bind(engine, asdict(settings))


def app_builder(args: dict):
    """`serve run mla_export.server.ray_serve.deployments:app_builder out_dir=out/tiny replicas=2`."""
    known = {k: v for k, v in args.items() if k in RaySettings.__dataclass_fields__}
    for k in ("replicas", "max_num_seqs", "max_queue", "imbalanced_threshold", "http_port"):
        if k in known:
            known[k] = int(known[k])
    if "stream_interval_s" in known:
        known["stream_interval_s"] = float(known["stream_interval_s"])
    known.setdefault("model_name", Path(known["out_dir"]).resolve().name)
    return build_application(RaySettings(**known))
