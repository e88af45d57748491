"""`mla-export serve OUT_DIR`: the OpenAI-compatible HTTP server on uvicorn.

Shutdown (SIGINT/SIGTERM): uvicorn stops accepting connections and lets running requests
finish for up to --shutdown-timeout seconds, then cancels the rest (each cancelled request is
aborted in the engine); the engine thread then stops and the command reports the cache state:
exit code 0 when no KV block is left held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from mla_export import envs
from mla_export.cli.engine_flags import add_decode_graph_flags, decode_graph_kwargs

from .serve_ray import parser_settings

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, '1000000' -> 1000000."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB, 1GB)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the size must be positive: {text!r}")
    return value


def _int_at_least(least: int):
    """An argparse type: an integer >= least, refused by name otherwise."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {v}")
        return v
    return parse


_positive, _non_negative = _int_at_least(1), _int_at_least(0)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="serve an exported model with an OpenAI-compatible HTTP API",
        description="Serve an exported model directory with an OpenAI-compatible HTTP API "
                    "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics).")
    p.add_argument("out_dir", nargs="?", metavar="OUT_DIR", help="a directory written by `mla-export export`")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send and /v1/models lists (default: OUT_DIR's name)")
    p.add_argument("--max-num-seqs", type=_positive, default=64, help="sequences the engine runs at once (default 64)")
    p.add_argument("--max-queue", type=_non_negative, default=256,
                   help="sequences that may wait beyond --max-num-seqs; more are refused with 429 (default 256)")
    p.add_argument("--max-num-batched-tokens", type=_positive, default=512,
                   help="token budget of one engine step (default 512)")
    p.add_argument("--kv-cache-memory", type=parse_size, default=None,
                   help="KV cache budget, e.g. 2GiB (default: the engine's: a full batch at full context, capped)")
    p.add_argument("--max-model-len", type=_positive, default=None,
                   help="longest sequence (prompt + output) served (default: the model's context, or what the KV "
                        "cache holds if less); a request without max_tokens gets the room left")
    p.add_argument("--num-blocks", type=_positive, default=None, help="KV cache size in blocks (instead of a budget)")
    p.add_argument("--precision", choices=("bf16", "f32"), default="bf16", help="CPU inference precision (default bf16)")
    p.add_argument("--threads", type=_positive, default=None, help="inference threads (default: the plugin's)")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    p.add_argument("--batch-invariant", action="store_true", default=envs.VLLM_BATCH_INVARIANT,
                   help="every request's output independent of the batch it runs in and of prefix-cache hits "
                        "(attention in one form; default: $VLLM_BATCH_INVARIANT=1; see docs/SERVING.md)")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="speculative decoding, as vLLM's: '{\"method\": \"ngram\", \"num_speculative_tokens\": 3, "
                        "\"prompt_lookup_max\": 4}' (n-gram drafts from the prompt and output), or "
                        "'{\"method\": \"mtp\", \"num_speculative_tokens\": 1}' (the export's MTP draft; docs/SERVING.md)")
    from mla_export.cli.commands.verify import add_verify_flag

    add_verify_flag(p)
    add_decode_graph_flags(p)
    p.add_argument("--api-key", default=envs.MLA_EXPORT_API_KEY,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $MLA_EXPORT_API_KEY, else none)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja2 chat template file overriding the model directory's")
    _add_parser_flags(p)
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds running requests get to finish on shutdown before they are cancelled (default 30)")
    p.add_argument("--replicas", type=_positive, default=None,
                   help="serve on Ray Serve with N engine replicas behind one endpoint, prefix-aware routing "
                        "(needs the [ray] extra; docs/RAY.md). Without it: one engine in this process")
    p.add_argument("--ray-address", default=None,
                   help="with --replicas: the Ray cluster to join (e.g. auto, or HEAD:6379 after `ray start --head`); "
                        "default: start a local one")
    p.add_argument("--replica-cpus", type=float, default=1.0,
                   help="with --replicas: Ray CPUs reserved per engine replica (default 1; match --threads)")
    p.add_argument("--stream-interval-ms", type=float, default=0.0,
                   help="with --replicas: send a stream's tokens after the first at most every N ms, several per "
                        "chunk (default 0: every engine step; more cuts the per-token cost of Ray's two hops)")
    p.add_argument("--log-level", "--uvicorn-log-level", dest="log_level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    _add_logging_flags(p)
    _add_vllm_aliases(p)
    return p


def _add_parser_flags(p) -> None:
    """vLLM's tool-calling and reasoning flags (docs/SERVING.md: Tool calling, Reasoning outputs)."""
    from mla_export.server.reasoning_parsers import REASONING_PARSERS
    from mla_export.server.tool_parsers import TOOL_PARSERS

    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="parse tool calls out of chat outputs when a request has tools (tool_choice auto); "
                        "needs --tool-call-parser")
    p.add_argument("--tool-call-parser", choices=sorted(TOOL_PARSERS), default=None,
                   help="the model's tool-call format: deepseek_v3 (V3, R1), deepseek_v31 (V3.1+), kimi_k2, "
                        "glm45 (GLM-4.5/4.6/4.7), hermes")
    p.add_argument("--reasoning-parser", choices=list(REASONING_PARSERS), default=None,
                   help="split the thinking (<think>...</think>) out of chat outputs into `reasoning` / "
                        "`reasoning_content`")


def _log_stats_interval_default() -> float:
    """vLLM's VLLM_LOG_STATS_INTERVAL when it is a positive number of seconds, else 10."""
    return envs.VLLM_LOG_STATS_INTERVAL


def _positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _add_logging_flags(p) -> None:
    """vLLM's logging flags (docs/SERVING.md, Logging). Prompts are never logged."""
    p.add_argument("--enable-log-requests", dest="log_requests", action="store_true", default=True,
                   help="log a 'Received request' and a 'Finished request' line per sequence: id, token counts, "
                        "finish reason, never the prompt (the default here)")
    p.add_argument("--no-enable-log-requests", "--disable-log-requests", dest="log_requests", action="store_false",
                   help="do not log each request")
    p.add_argument("--disable-uvicorn-access-log", action="store_true",
                   help="no access log line per HTTP request (client, method, path, status)")
    p.add_argument("--disable-access-log-for-endpoints", default="", metavar="PATHS",
                   help="comma-separated paths whose requests the access log leaves out (e.g. /health,/metrics)")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="no periodic stats line (throughput, running/waiting, KV cache usage, prefix cache hit rate)")
    p.add_argument("--log-stats-interval", type=_positive_seconds, default=_log_stats_interval_default(),
                   help="seconds between stats lines when something happened (default: $VLLM_LOG_STATS_INTERVAL, else 10)")


def _add_vllm_aliases(p) -> None:
    """vllm serve's spellings that mean something here (the rest get a hint: cli_hints)."""
    from .generate import dtype_arg

    p.add_argument("--model", dest="model_opt", metavar="OUT_DIR", help="same as OUT_DIR (vLLM's older spelling)")
    p.add_argument("--dtype", dest="precision", type=dtype_arg, default=argparse.SUPPRESS, help="vLLM's name for --precision (auto = bf16)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="accepted when it is auto or the export's cache format, in our names or vLLM's "
                        "(fp8_e4m3, fp8_e5m2, bfloat16, ...); the cache is fixed at export: --kv-dtype")
    p.add_argument("--enable-prefix-caching", dest="no_prefix_caching", action="store_false", default=argparse.SUPPRESS,
                   help="the default (vLLM's spelling)")
    p.add_argument("--no-enable-prefix-caching", dest="no_prefix_caching", action="store_true", default=argparse.SUPPRESS,
                   help="same as --no-prefix-caching")
    p.add_argument("--trust-remote-code", action="store_true", help="accepted and ignored: no model code is run")
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                   help="request sampling defaults: auto (default) = the export's generation_config.json "
                        "(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens), vllm = none, "
                        "or a directory holding a generation_config.json")


def _kv_cache_dtype(value: str) -> str | None:
    """--kv-cache-dtype as a cache format name of the registry (None for auto), else ValueError."""
    from mla_export.formats.kv_formats import KV_DTYPES, VLLM_NAMES

    if value == "auto":
        return None
    name = VLLM_NAMES.get(value, value)
    if name not in KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {value}: not a cache format (auto, {', '.join(KV_DTYPES)} or vLLM's "
                         f"{', '.join(VLLM_NAMES)}); the cache is fixed at export: `mla-export export --kv-dtype`")
    return name


def _check_aliases(args) -> str | None:
    """The export directory from OUT_DIR / --model, or an error message (as `error: ...`)."""
    if args.model_opt is not None and args.out_dir is not None and args.model_opt != args.out_dir:
        return "give the export directory once (OUT_DIR or --model)"
    args.out_dir = args.model_opt or args.out_dir
    if args.out_dir is None:
        return "give the export directory: mla-export serve OUT_DIR"
    from mla_export.cli.hints import hub_id_message, looks_like_hub_id

    if looks_like_hub_id(args.out_dir):
        return hub_id_message(args.out_dir, "serve")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        return "--enable-auto-tool-choice needs --tool-call-parser NAME (the model's tool-call format)"
    try:
        _kv_cache_dtype(args.kv_cache_dtype)
    except ValueError as e:
        return str(e)
    return None


def _spec_note(engine) -> str:
    cfg = engine.speculative_config
    if cfg is None:
        return ""
    if cfg.method == "mtp":
        return f", speculative mtp (k={cfg.num_speculative_tokens}, the export's MTP draft)"
    return (f", speculative {cfg.method} (k={cfg.num_speculative_tokens}, "
            f"lookup {cfg.prompt_lookup_min}..{cfg.prompt_lookup_max})")


def run(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from mla_export.server.startup import check_port

    # Before anything slow: a taken port fails now, not after the model has loaded.
    busy = check_port(args.host, args.port)
    if busy:
        print(f"mla-export serve: {busy}", file=sys.stderr)
        return 1
    try:
        import uvicorn
        from mla_export.runtime.engine import LLMEngine
        from mla_export.server.app import create_app
    except ImportError as e:
        from mla_export.deps import missing_message

        print(f"mla-export serve: {missing_message(e.name or 'uvicorn', '`mla-export serve`')}", file=sys.stderr)
        return 2
    problem = _check_aliases(args)
    if problem:
        print(f"mla-export serve: {problem}", file=sys.stderr)
        return 2
    from mla_export.runtime.spec_decode import SpeculativeConfig

    try:  # before the model loads: a bad config is one line and exit 2
        args.speculative_config = SpeculativeConfig.parse(args.speculative_config)
    except ValueError as e:
        print(f"mla-export serve: --speculative-config: {e}", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    if args.kv_cache_memory is not None and args.num_blocks is not None:
        print("mla-export serve: give --kv-cache-memory or --num-blocks, not both", file=sys.stderr)
        return 2
    if args.replicas is None and (args.ray_address is not None or args.stream_interval_ms):
        flag = "--ray-address" if args.ray_address is not None else "--stream-interval-ms"
        print(f"mla-export serve: {flag} goes with --replicas N", file=sys.stderr)
        return 2
    if args.replicas is not None:
        from .serve_ray import run_ray

        return run_ray(args, out_dir)
    try:
        engine = LLMEngine(out_dir, precision=args.precision, num_threads=args.threads, num_blocks=args.num_blocks,
                           kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
                           max_num_batched_tokens=args.max_num_batched_tokens,
                           enable_prefix_caching=not args.no_prefix_caching, max_model_len=args.max_model_len,
                           batch_invariant=args.batch_invariant, verify=args.verify,
                           speculative_config=args.speculative_config, **decode_graph_kwargs(args))
    except (FileNotFoundError, ValueError) as e:
        print(f"mla-export serve: {e}", file=sys.stderr)
        return 2
    want_kv = _kv_cache_dtype(args.kv_cache_dtype)
    if want_kv is not None and want_kv != engine.facts.cache_dtype:
        print(f"mla-export serve: --kv-cache-dtype {args.kv_cache_dtype}: {out_dir} was exported with a "
              f"{engine.facts.cache_dtype} cache; re-export with `mla-export export --kv-dtype {want_kv}`",
              file=sys.stderr)
        return 2
    name = args.served_model_name or out_dir.resolve().name
    try:
        app = create_app(engine, model_name=name, api_key=args.api_key, max_num_seqs=args.max_num_seqs,
                         max_queue=args.max_queue, chat_template=args.chat_template,
                         generation_config=args.generation_config, log_requests=args.log_requests,
                         log_stats_interval=None if args.disable_log_stats else args.log_stats_interval,
                         **parser_settings(args))
    except (FileNotFoundError, ValueError) as e:
        print(f"mla-export serve: {e}", file=sys.stderr)
        return 2
    st = app.state.server
    stats = engine.stats()
    from mla_export.server.startup import GIB, memory_report

    mem = memory_report(engine, args.precision)
    weights = "?" if mem["weights_bytes"] is None else f"{mem['weights_bytes'] / GIB:.2f}"
    print(f"mla-export serve: model '{name}' from {out_dir}, max_model_len {st.max_model_len} tokens "
          f"(model {engine.facts.max_model_len}, KV cache {stats['kv_blocks_total'] * stats['kv_block_size']}), "
          f"{stats['kv_blocks_total']} KV blocks of {stats['kv_block_size']} tokens "
          f"(KV cache {mem['kv_cache_bytes'] / GIB:.2f} GiB {engine.facts.cache_dtype}, weights {weights} GiB), "
          f"chat {'on' if st.chat_template else 'off'}, auth {'on' if args.api_key else 'off'}"
          f"{', batch-invariant' if engine.backend.batch_invariant else ''}{_spec_note(engine)}", file=sys.stderr)
    from mla_export.server.draining import DrainingServer

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout, lifespan="on",
                            access_log=not args.disable_uvicorn_access_log)
    from mla_export.server.access_log import skip_paths

    skip_paths(args.disable_access_log_for_endpoints)
    server = DrainingServer(config, st)
    server.run()
    final = st.final_stats
    if final is None:  # uvicorn never ran the lifespan shutdown (failed start, or forced exit)
        print("mla-export serve: stopped without a clean shutdown", file=sys.stderr)
        return 1
    used = final.get("kv_blocks_used", 0)
    print(f"mla-export serve: stopped; running={final.get('num_running')} waiting={final.get('num_waiting')} "
          f"kv_blocks_used={used} of {final.get('kv_blocks_total')}", file=sys.stderr)
    return 0 if used == 0 and not final.get("num_running") and not final.get("num_waiting") else 1
