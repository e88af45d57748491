"""`mla-export serve OUT_DIR --replicas N` as a command: flags, start on a local Ray cluster,
and a graceful shutdown that lets a running stream finish (SIGTERM drains). Runs after
test_ray_serve.py's cluster is gone (one Ray cluster at a time on the machine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from server_helpers import REPO, free_port

pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]'; the test extra has it)")

START_S = 240.0  # waits for the cluster to come up / go down; not a performance threshold


@pytest.fixture(scope="module")
def model_dir(exports):
    return exports.tiny()


def test_ray_flags_are_checked(model_dir):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "mla_export.cli", "serve", str(model_dir), *args], cwd=REPO,
                              capture_output=True, text=True, timeout=120)

    r = run("--ray-address", "auto")
    assert r.returncode == 2 and "--ray-address goes with --replicas N" in r.stderr
    r = run("--stream-interval-ms", "5")
    assert r.returncode == 2 and "--stream-interval-ms goes with --replicas N" in r.stderr
    r = run("--replicas", "0")
    assert r.returncode == 2 and "must be >= 1" in r.stderr
    r = run("--replicas", "1", "--port", "0")
    assert r.returncode == 2 and "fixed --port" in r.stderr


def test_sigterm_drains_running_streams(model_dir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mla_export.cli", "serve", str(model_dir), "--replicas", "1",
                             "--port", str(port), "--threads", "1", "--precision", "f32", "--log-level", "warning",
                             "--served-model-name", "tiny", "--shutdown-timeout", "60",
                             "--stream-interval-ms", "5"],  # coalesced chunks: the count below checks none is lost
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the Ray server did not start"
            time.sleep(1)
        got: dict = {}
        first = threading.Event()
        # As long as the context allows: the stream must outlive the signal by far.
        max_tokens = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["max_model_len"] - 3

        def stream():
            body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "ignore_eos": True, "return_token_ids": True}
            n, last = 0, None
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        d = json.loads(line[6:])
                        assert "error" not in d, d
                        for ch in d["choices"]:
                            n += len(ch.get("token_ids") or [])
                            last = ch.get("finish_reason") or last
                        first.set()
            got.update(n=n, reason=last)

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(START_S)
        assert t.is_alive()
        proc.send_signal(signal.SIGTERM)  # as `kill PID` would
        t.join(START_S)
        assert got == {"n": max_tokens, "reason": "length"}  # it finished although shutdown had begun
        out, _ = proc.communicate(timeout=START_S)
        assert proc.returncode == 0, out
        assert "draining" in out and "stopped" in out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
