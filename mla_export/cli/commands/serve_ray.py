"""`mla-export serve OUT_DIR --replicas N [--ray-address ADDR]`: the server on Ray Serve.

Joins the Ray cluster at --ray-address (or starts a local one), deploys the application
(mla_export/server/ray_serve) with Ray Serve's direct ingress (the ingress replica serves HTTP
itself on --host/--port; Ray Serve's own proxy gets another free port and stays idle: flags.py)
and waits for SIGINT/SIGTERM. Shutdown deletes the application: Ray Serve stops sending requests, lets
running ones finish for up to --shutdown-timeout seconds, then stops the replicas (each one
stops its engine loop, aborting what is left).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path

from mla_export.cli.engine_flags import decode_graph_kwargs

APP_NAME = "mla-export"


def settings_from_args(args, out_dir: Path):
    from mla_export.server.ray_serve.deployments import RaySettings

    engine_kwargs = {"precision": args.precision, "num_threads": args.threads, "num_blocks": args.num_blocks,
                     "kv_cache_memory": args.kv_cache_memory, "max_num_batched_tokens": args.max_num_batched_tokens,
                     "enable_prefix_caching": not args.no_prefix_caching, "max_model_len": args.max_model_len,
                     "batch_invariant": args.batch_invariant,
                     "speculative_config": args.speculative_config, **decode_graph_kwargs(args),
                     "verify": args.verify}  # each replica checks its node's copy of the export
    chat_template = args.chat_template
    if chat_template is not None and Path(chat_template).is_file():  # the replicas may be on other nodes
        chat_template = Path(chat_template).read_text(encoding="utf-8")
    return RaySettings(out_dir=str(out_dir.resolve()), model_name=args.served_model_name or out_dir.resolve().name,
                       replicas=args.replicas, api_key=args.api_key, chat_template=chat_template,
                       generation_config=args.generation_config,
                       max_num_seqs=args.max_num_seqs, max_queue=args.max_queue, engine_kwargs=engine_kwargs,
                       replica_cpus=args.replica_cpus, shutdown_timeout_s=args.shutdown_timeout,
                       stream_interval_s=args.stream_interval_ms / 1000.0, http_port=args.port,
                       parsers=parser_settings(args))


def free_port(host: str) -> int:
    """A port the OS has free now, for Ray Serve's (idle) proxy: the public port is the ingress's."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_ray(args, out_dir: Path) -> int:
    try:
        import ray
        from ray import serve

        from mla_export.server.ray_serve.deployments import build_application
    except ImportError as e:
        from mla_export.deps import missing_message

        print(f"mla-export serve: {missing_message(e.name or 'ray', '`mla-export serve --replicas`')}", file=sys.stderr)
        return 2
    if args.port == 0:
        print("mla-export serve: --replicas needs a fixed --port (the ingress replica serves that port)", file=sys.stderr)
        return 2
    if not 1 <= args.port <= 65534:
        print(f"mla-export serve: --port must be in 1..65534, got {args.port}", file=sys.stderr)
        return 2
    if args.stream_interval_ms < 0:
        print(f"mla-export serve: --stream-interval-ms must be >= 0, got {args.stream_interval_ms}", file=sys.stderr)
        return 2
    if args.replica_cpus <= 0:
        print(f"mla-export serve: --replica-cpus must be > 0, got {args.replica_cpus}", file=sys.stderr)
        return 2
    if not (out_dir / "mla_graph.json").is_file():
        print(f"mla-export serve: {out_dir}: not an export directory (no mla_graph.json)", file=sys.stderr)
        return 2
    settings = settings_from_args(args, out_dir)
    try:
        build_application(settings)  # checks the export before Ray starts
    except (FileNotFoundError, ValueError) as e:
        print(f"mla-export serve: {e}", file=sys.stderr)
        return 2
    from mla_export.server.ray_serve.flags import CONTROLLER_KEYS, serve_env

    env = serve_env(args.port)
    if args.ray_address is not None:  # the running Serve controller read its flags when the head started
        print("mla-export serve: joining a running cluster: its head node must have been started with "
              + " ".join(f"{k}={env[k]}" for k in CONTROLLER_KEYS) + " (docs/RAY.md)", file=sys.stderr)
    os.environ.update(env)  # a local cluster started here inherits them (the Serve controller reads them)
    ray.init(address=args.ray_address, logging_level=args.log_level.upper(), include_dashboard=False,
             runtime_env={"env_vars": env})
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        # The endpoint is this machine's --host:--port: the ingress runs on this Ray node.
        settings.ingress_node_ip = ray.util.get_node_ip_address()
        app = build_application(settings)
        serve.start(http_options={"host": args.host, "port": free_port(args.host)})
        serve.run(app, name=APP_NAME, route_prefix="/")
        print(f"mla-export serve: model '{settings.model_name}' from {out_dir} on Ray Serve, {settings.replicas} "
              f"replicas, http://{args.host}:{args.port}/v1, auth {'on' if args.api_key else 'off'}", file=sys.stderr)
        while not stop.wait(1.0):
            pass
        print("mla-export serve: draining (up to --shutdown-timeout seconds)", file=sys.stderr)
        serve.delete(APP_NAME)  # graceful: running requests finish first
        if args.ray_address is None:
            serve.shutdown()
    finally:
        ray.shutdown()
    print("mla-export serve: stopped", file=sys.stderr)
    return 0


def parser_settings(args) -> dict:
    """ServerState's parser keyword arguments from the flags."""
    return {"tool_call_parser": args.tool_call_parser, "enable_auto_tool_choice": args.enable_auto_tool_choice,
            "reasoning_parser": args.reasoning_parser}
