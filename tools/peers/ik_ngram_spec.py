"""ik_llama.cpp's n-gram self-speculation (its llama-server `--spec-type ngram-simple`) against its
plain decoding, on token-id prompts, for a side-by-side with `tools/bench_spec_decode.py`.

Two llama-server processes on one GGUF (plain, and with n-gram drafts), each prompt sent to both
in turn (A B A B) as token ids (`/completion` takes a list of ids: the random checkpoints' byte-level
vocabularies do not round-trip through text, so a text prompt would not be the same tokens),
greedy, `--new-tokens` tokens past the prompt whatever the model emits (ignore_eos). Each request's
decode rate and drafted / accepted counts are read from the server's own timing lines in its log
("eval time = ... tokens per second", "draft acceptance rate = ..."): its JSON reply fails (HTTP 500)
when the generated text is not valid UTF-8, which random vocabularies' tokens often are, after the
generation itself has run and been timed. Prints one JSON object (medians over rounds x prompts). Peer only: needs an ik_llama.cpp build with llama-server
(`mla-export bench setup-peers ik_llamacpp`, then `cmake -DLLAMA_BUILD_SERVER=ON` and
`make llama-server` in its build directory).

    python tools/peers/ik_ngram_spec.py --server IK/bin/llama-server --gguf X.gguf \\
        --prompts CKPT-succ/prompts.json --draft 3 --ngram 3 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mla_export.bench.peers import IK_FLAGS  # noqa: E402  (ik's DeepSeek flags, as `mla-export bench` runs it)
from mla_export.cli.commands.serve_ray import free_port  # noqa: E402


def _post(port: int, path: str, body: dict, timeout: float) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
    except urllib.error.HTTPError as e:
        if e.code != 500:  # 500: the reply's text could not be encoded (the timings are in the log)
            raise


EVAL = re.compile(r"^\s*eval time =\s*([\d.]+) ms /\s*(\d+) tokens .*?([\d.]+) tokens per second", re.M)
DRAFT = re.compile(r"draft acceptance rate = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")


def _timings(log: Path, start: int) -> dict:
    """The request's timing lines, from byte `start` of the server's log on."""
    text = log.read_bytes()[start:].decode(errors="replace")
    ev = EVAL.findall(text)
    if not ev:
        raise SystemExit(f"no 'eval time' line in {log} after the request")
    ms, n, _ = ev[-1]
    dr = DRAFT.findall(text)
    acc, gen = (int(dr[-1][0]), int(dr[-1][1])) if dr else (0, 0)
    return {"tok_s": int(n) / (float(ms) / 1e3), "n": int(n), "drafted": gen, "accepted": acc}


def _start(server: Path, gguf: Path, threads: int, ctx: int, extra: list[str], log: Path) -> tuple[subprocess.Popen, int, Path]:
    port = free_port("127.0.0.1")
    cmd = [str(server), "-m", str(gguf), "-t", str(threads), "-c", str(ctx), "--port", str(port), "-np", "1",
           *IK_FLAGS, *extra]
    p = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    t0 = time.time()
    while time.time() - t0 < 600:
        if p.poll() is not None:
            raise SystemExit(f"llama-server exited with {p.returncode}: see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return p, port, log
        except OSError:
            pass
        time.sleep(1)
    p.kill()
    raise SystemExit(f"llama-server did not answer /health within 600 s: see {log}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", type=Path, required=True, help="ik_llama.cpp's llama-server")
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True, help="JSON list of token-id prompts")
    ap.add_argument("--draft", type=int, default=3, help="drafted tokens a step (--draft-max, --spec-ngram-size-m)")
    ap.add_argument("--ngram", type=int, default=3, help="n-gram looked up (--spec-ngram-size-n)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--log-dir", type=Path, default=Path("."))
    a = ap.parse_args(argv)
    for name in ("server", "gguf", "prompts"):
        if not getattr(a, name).is_file():
            ap.error(f"--{name}: no such file: {getattr(a, name)}")
    for name in ("draft", "ngram", "new_tokens", "rounds", "threads", "ctx"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    prompts = json.loads(a.prompts.read_text())
    if not (isinstance(prompts, list) and prompts
            and all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts)):
        ap.error("--prompts must be a JSON list of non-empty lists of token ids")
    if max(len(p) for p in prompts) + a.new_tokens > a.ctx:
        ap.error(f"--ctx {a.ctx} is shorter than the longest prompt + --new-tokens")
    a.log_dir.mkdir(parents=True, exist_ok=True)
    spec = ["--spec-type", "ngram-simple", "--spec-ngram-size-n", str(a.ngram), "--spec-ngram-size-m", str(a.draft),
            "--draft-max", str(a.draft), "--draft-min", "1"]
    servers = {}
    try:
        servers["plain"] = _start(a.server, a.gguf, a.threads, a.ctx, [], a.log_dir / "ik_plain.log")
        servers["ngram"] = _start(a.server, a.gguf, a.threads, a.ctx, spec, a.log_dir / "ik_ngram.log")
        runs = {k: [] for k in servers}
        for _ in range(a.rounds):
            for p in prompts:
                for kind, (_, port, log) in servers.items():
                    start = log.stat().st_size
                    _post(port, "/completion", {"prompt": p, "n_predict": a.new_tokens, "temperature": 0,
                                                "top_k": 1, "cache_prompt": False, "ignore_eos": True}, 600)
                    time.sleep(0.2)  # the log lines follow the reply
                    runs[kind].append(_timings(log, start))
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    plain = statistics.median(x["tok_s"] for x in runs["plain"])
    ngram = statistics.median(x["tok_s"] for x in runs["ngram"])
    drafted = sum(x["drafted"] for x in runs["ngram"])
    accepted = sum(x["accepted"] for x in runs["ngram"])
    print(json.dumps({"system": "ik_llama.cpp llama-server", "flags": IK_FLAGS, "spec": spec, "prompts": len(prompts),
                      "rounds": a.rounds, "new_tokens": a.new_tokens, "decode_tok_s_plain": plain,
                      "decode_tok_s_spec": ngram, "speedup": ngram / plain,
                      "acceptance_rate": accepted / drafted if drafted else 0.0, "drafted": drafted,
                      "accepted": accepted, "tokens_per_request": statistics.median(x["n"] for x in runs["ngram"])},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
