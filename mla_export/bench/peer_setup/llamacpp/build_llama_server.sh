#!/usr/bin/env bash
# Adds llama.cpp's OpenAI-compatible `llama-server` to the peer set up by setup_llamacpp_peer.sh
# (same sources, same build directory and instruction-set choice), for tools/bench_serve.py.
# Never a dependency of the project or its CI.
#   usage: build_llama_server.sh [DIR]     (default DIR: $HOME/.cache/mla-peers/llamacpp; run setup first)
# Afterwards: DIR/bin/llama-server -m X.gguf --host 127.0.0.1 --port 8080 -c 18432 -np 16 -t 2
# The web UI is left out: its assets come from npm or a download, neither of which is wanted here
# (LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF: the server embeds an empty asset table).
set -euo pipefail
DIR=${1:-$HOME/.cache/mla-peers/llamacpp}
[ -f "$DIR/build/CMakeCache.txt" ] || { echo "no llama.cpp build in $DIR: run setup_llamacpp_peer.sh first" >&2; exit 1; }
cd "$DIR"
# Re-configure the existing build (its cached GGML_* instruction-set flags stay) with the server on.
cmake -S src -B build -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >/dev/null
cmake --build build -j2 --target llama-server >build-server.log 2>&1 || { tail -30 build-server.log; exit 1; }
mkdir -p bin && ln -sfn "$DIR/build/bin/llama-server" bin/llama-server
echo "llama-server: $DIR/bin/llama-server"
