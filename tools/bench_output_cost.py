"""Engine-side cost of one step's outputs at long outputs: the old way (every request's whole
output re-decoded, prompt and output copied) against incremental detokenization with
cumulative outputs and with delta outputs (`SamplingParams(output_kind=...)`).

    python tools/bench_output_cost.py OUT_DIR [--requests 32] [--prompt 1000] [--output 4000]

OUT_DIR: any export with a tokenizer (e.g. `mla-export export --preset tiny -o out/tiny`). The
output ids are the README's text tokenized (real text, multi-byte characters included). Medians
of 7 rounds, the three ways alternated within each round. No model runs: only the output
building that `LLMEngine.step` does after sampling.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=1000)
    ap.add_argument("--output", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()

    from tokenizers import Tokenizer

    from mla_export.formats.contract import load_contract
    from mla_export.runtime.detokenizer import IncrementalDetokenizer
    from mla_export.runtime.engine import LLMEngine
    from mla_export.runtime.request import Request
    from mla_export.runtime.sampling import SamplingParams

    tok = Tokenizer.from_file(str(load_contract(a.out_dir).tokenizer_path()))
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    ids = tok.encode(text, add_special_tokens=False).ids
    ids = (ids * (a.output // max(len(ids), 1) + 1))[:a.output]
    engine = LLMEngine.__new__(LLMEngine)  # only _output is used: no model is compiled
    engine.tokenizer = tok

    def requests(kind):
        out = []
        for i in range(a.requests):
            r = Request(f"r{i}", list(range(a.prompt)), SamplingParams(max_tokens=10**9, output_kind=kind), None)
            r.detokenizer = IncrementalDetokenizer(tok)
            for t in ids:
                r.append_output(t)
                r.detokenizer.step(t)
            out.append(r)
        return out

    def old(rs):  # what step() did before: a full decode and two copies per request
        return [(tok.decode(r.output_token_ids, skip_special_tokens=True), list(r.prompt_token_ids),
                 list(r.output_token_ids)) for r in rs]

    def new(rs):
        return [engine._output(r, [ids[-1]], r.detokenizer.step(ids[-1])) for r in rs]

    cum, delta = requests("cumulative"), requests("delta")
    times: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for name, fn, rs in (("full decode + copies (before)", old, cum), ("incremental, cumulative", new, cum),
                             ("incremental, delta", new, delta)):
            t = time.perf_counter()
            fn(rs)
            times.setdefault(name, []).append(time.perf_counter() - t)
    print(f"{a.requests} requests, prompt {a.prompt}, output {a.output} ids; ms per step (median of {a.rounds}):")
    for name, v in times.items():
        print(f"  {name:<32} {statistics.median(v) * 1e3:8.2f}")


if __name__ == "__main__":
    main()
