#!/usr/bin/env python
"""Serving benchmark: a load generator speaking vLLM's `vllm bench serve` protocol (the random
dataset as text prompts, streamed /v1/completions, vLLM's metrics and result field names) against
any OpenAI-compatible server; the code is in mla_export/bench/serving/, the protocol and the
figures in docs/BENCHMARKS.md ("Serving benchmark"). You start the servers; the tool only talks
to them. Both must serve the same model, with the same vocabulary (the GGUF made from the
checkpoint the export was made from), and the tokenizer given here is the export's.

Start the servers (2 cores each here, 16 sequences in flight at most, loopback only):

    mla-export serve EXPORT --port 8000 --max-num-seqs 16 --threads 2
    ~/.cache/mla-peers/llamacpp/bin/llama-server -m MODEL.gguf --host 127.0.0.1 --port 8080 \\
        -c 18432 -np 16 -t 2          # -c: 16 slots x (1024 prompt + 128 output) tokens

(llama-server: `bash mla_export/bench/peer_setup/llamacpp/setup_llamacpp_peer.sh` then
`bash mla_export/bench/peer_setup/llamacpp/build_llama_server.sh`; the GGUF from `llamacpp/convert.py` there, see
tools/peers/README.md.) Then one invocation measures both, alternately, at every concurrency:

    python tools/bench_serve.py --tokenizer EXPORT \\
        --base-url http://127.0.0.1:8000 --label ours --base-url-b http://127.0.0.1:8080 --label-b llamacpp \\
        --random-input-len 1024 --random-output-len 128 --num-prompts 32 --temperature 0 \\
        --sweep-concurrency 1,2,4,8,16 --rounds 3 --num-warmups 2 \\
        --result-dir bench_results --result-filename serve.json --markdown bench_results/serve.md

One target alone: drop --base-url-b. A fixed arrival rate instead of a closed loop:
--request-rate 0.5 (Poisson) with --max-concurrency as a cap.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a source tree without installing

from mla_export.bench.serving.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
