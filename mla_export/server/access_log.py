"""uvicorn's access log (one line per HTTP request: client, method, path, status) without the
paths an operator names (vLLM's --disable-access-log-for-endpoints, e.g. probes and scrapes)."""

from __future__ import annotations

import logging

__all__ = ["skip_paths", "PathFilter"]


class PathFilter(logging.Filter):
    """Drops uvicorn.access records whose path (query string ignored) is one of `paths`."""

    def __init__(self, paths):
        super().__init__()
        self.paths = frozenset(paths)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn logs '%s - "%s %s HTTP/%s" %d' with (client, method, path, http version, status).
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            return args[2].split("?", 1)[0] not in self.paths
        return True


def skip_paths(spec: str, logger: str = "uvicorn.access") -> PathFilter | None:
    """Install a PathFilter for the comma-separated paths of `spec` (nothing for an empty spec)."""
    paths = [p.strip() for p in (spec or "").split(",") if p.strip()]
    if not paths:
        return None
    f = PathFilter(paths)
    logging.getLogger(logger).addFilter(f)
    return f
