#!/usr/bin/env python
"""End-to-end benchmark: a thin wrapper of `mla-export bench` (mla_export/bench/run.py holds the
orchestration, workers.py the in-process workers, peers.py llama.cpp / vLLM / optimum-intel,
report.py the tables). See docs/BENCHMARKS.md for the systems, the figures and how to reproduce.

    python tools/bench_e2e.py --checkpoint /work/ckpt/v2lite-3l --prompt-lens 1024 --batches 1,8 --repeats 2
    python tools/bench_e2e.py --render bench_results/e2e.json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a source tree without installing

from mla_export.bench.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
