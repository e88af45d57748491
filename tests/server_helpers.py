"""Shared pieces of the server tests: one tiny export per test session, a live server on a
free loopback port (uvicorn in a thread, or `mla-export serve` in a subprocess), metrics parsing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
READY_DEADLINE_S = 300.0  # a wait for start-up, not a performance threshold


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """create_app(engine, ...) served by uvicorn in a daemon thread on a free port."""

    def __init__(self, engine, **app_kwargs):
        import uvicorn

        from mla_export.server.app import create_app

        self.app = create_app(engine, **app_kwargs)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=30, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + READY_DEADLINE_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> dict:
        self.server.should_exit = True
        self.thread.join(120)
        if self.thread.is_alive():
            raise RuntimeError("the test server did not stop")
        return self.app.state.server.final_stats

    def __exit__(self, *exc):
        self.stop()


def metrics(base: str, **headers) -> dict[str, float]:
    """GET /metrics as {name: value} for samples without labels other than model, plus
    labelled samples under their full text (`name{labels}`)."""
    from mla_export.server.metrics import parse_prometheus_text

    r = httpx.get(f"{base}/metrics", headers=headers, timeout=30)
    r.raise_for_status()
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for key, value in parse_prometheus_text(r.text).items():
        out[key] = value
        name, _, labels = key.partition("{")
        if labels.startswith('model="') and labels.count("=") == 1:
            out[name] = value
    return out


def wait_until(predicate, what: str, deadline_s: float = 120.0, interval: float = 0.02):
    """Poll until predicate() is truthy (a wait for an asynchronous effect, not a timing test)."""
    end = time.monotonic() + deadline_s
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for: {what}")
        time.sleep(interval)


def start_serve_subprocess(out_dir: Path, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "mla_export.cli", "serve", str(out_dir), "--port", str(port), *args]
    return start_serve_command(cmd, port, REPO, dict(os.environ, PYTHONUNBUFFERED="1"))


def start_serve_command(cmd: list[str], port: int, cwd: Path, env: dict,
                        what: str = "mla-export serve") -> tuple[subprocess.Popen, str]:
    """`cmd` (a serve command on `port`) started, once /health answers 200: (process, base URL)."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"

    def ready():
        if proc.poll() is not None:
            raise AssertionError(f"serve exited early ({proc.returncode}):\n{proc.stderr.read()}")
        try:
            return httpx.get(f"{base}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, f"{what} to answer /health", READY_DEADLINE_S, 0.1)
    return proc, base


def openai_client(srv, **kw):
    """The official client on a ServerThread: no retries (a test sees every failure), long timeout."""
    import openai

    kw.setdefault("api_key", "unused")
    return openai.OpenAI(base_url=f"{srv.base}/v1", max_retries=0, timeout=300, **kw)
