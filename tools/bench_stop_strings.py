"""What stop strings cost a served request: the same requests with and without long stop
strings that never match (so every request still generates all its tokens), against a live
in-process server (uvicorn on loopback, the real engine).

    python tools/bench_stop_strings.py OUT_DIR [--n 16] [--max-tokens 300] [--stops 16] [--rounds 5]

OUT_DIR: any export with a tokenizer (e.g. `mla-export export --preset tiny -o out/tiny`: its
model is so small that the server's own per-token work shows). Each round sends one streamed
and one non-streamed completion with `n` choices, `ignore_eos`, with and without the stop
strings, alternated; medians of the rounds are printed, and the ratio with/without.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import sys
import threading
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--stops", type=int, default=16)
    ap.add_argument("--stop-len", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()

    import httpx
    import uvicorn

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from server_helpers import free_port

    from mla_export.runtime import LLMEngine
    from mla_export.server.app import create_app

    engine = LLMEngine(a.out_dir, precision="f32", max_num_seqs=a.n, max_num_batched_tokens=512)
    app = create_app(engine, model_name="bench", max_num_seqs=a.n, max_queue=a.n)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)

    rng = random.Random(0)
    # Never in the output of a tiny random model: long strings of an alphabet it rarely emits.
    stops = ["".join(rng.choice(string.ascii_uppercase) for _ in range(a.stop_len)) for _ in range(a.stops)]
    base = {"model": "bench", "prompt": "The quick brown fox", "max_tokens": a.max_tokens, "n": a.n,
            "temperature": 1.0, "seed": 1, "ignore_eos": True}
    url = f"http://127.0.0.1:{port}/v1/completions"

    def one(stream: bool, stop: list[str]) -> float:
        body = dict(base, stream=stream, stop=stop)
        t0 = time.perf_counter()
        with httpx.Client(timeout=600) as c:
            if stream:
                with c.stream("POST", url, json=body) as r:
                    r.raise_for_status()
                    for _ in r.iter_lines():
                        pass
            else:
                r = c.post(url, json=body)
                r.raise_for_status()
                assert all(ch["finish_reason"] == "length" for ch in r.json()["choices"]), "a stop string matched"
        return time.perf_counter() - t0

    times: dict[tuple[bool, bool], list[float]] = {(s, w): [] for s in (False, True) for w in (False, True)}
    one(False, [])  # warm-up
    for _ in range(a.rounds):
        for stream in (False, True):
            for with_stops in (False, True):
                times[(stream, with_stops)].append(one(stream, stops if with_stops else []))
    server.should_exit = True
    print(f"n={a.n} max_tokens={a.max_tokens} stops={a.stops}x{a.stop_len} chars, medians of {a.rounds} rounds")
    for stream in (False, True):
        plain = statistics.median(times[(stream, False)])
        stopped = statistics.median(times[(stream, True)])
        print(f"  {'stream' if stream else 'json  '}: without stops {plain:.3f} s, with stops {stopped:.3f} s, "
              f"ratio {stopped / plain:.2f}")


if __name__ == "__main__":
    main()
