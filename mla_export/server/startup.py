"""What `mla-export serve` checks and reports before it serves: the listening address (tried
before the model loads, so a taken port fails at once instead of after minutes of compiling),
and the memory the engine holds (KV cache and weights, in GiB)."""

from __future__ import annotations

import socket

__all__ = ["check_port", "memory_report", "GIB"]

GIB = float(1 << 30)


def check_port(host: str, port: int) -> str | None:
    """None when `host:port` can be listened on now, else a message naming it. Binds the way
    uvicorn does (SO_REUSEADDR, so a port in TIME_WAIT passes) and releases it at once; port 0
    (any free port) always passes."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot listen on {host}:{port}: the host does not resolve ({e.strerror})"
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
            s.listen(1)
        except OSError as e:
            hint = " (another server is using it: pick another --port, or stop that one)" \
                if e.errno in (98, 48, 10048) else ""  # EADDRINUSE on Linux, macOS, Windows
            return f"cannot listen on {host}:{port}: {e.strerror or e}{hint}"
    return None


def memory_report(engine, precision: str) -> dict:
    """{"kv_cache_bytes", "weights_bytes"}: the KV cache arrays (every block of every layer) and
    the weights as the compiled model holds them (memory_plan.resident_weight_bytes: widened
    where the CPU has no native 2-byte type; None when it cannot be told)."""
    from mla_export.runtime.cache_layout import CacheLayout

    kv = CacheLayout.of(engine.contract).block_bytes * engine.kv_cache.num_blocks
    weights = None
    try:
        from mla_export.ops.memory_plan import native_float_types, resident_weight_bytes
        from mla_export.runtime.model_dir import graph_path

        path = graph_path(engine.contract)
        bin_path = path.with_suffix(".bin") if path.suffix == ".xml" else path.parent / f"{path.name}.data"
        size = bin_path.stat().st_size if bin_path.is_file() else 0
        weights = resident_weight_bytes(engine.contract.raw["export"], precision, size, native_float_types())
    except Exception:  # noqa: BLE001 - a report, never a reason not to serve
        weights = None
    return {"kv_cache_bytes": kv, "weights_bytes": weights}
