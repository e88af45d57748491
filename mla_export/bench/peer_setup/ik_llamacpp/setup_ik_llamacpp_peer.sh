#!/usr/bin/env bash
# Builds ik_llama.cpp's benchmark tools (llama-batched-bench, llama-bench, llama-sweep-bench,
# llama-quantize, llama-perplexity for `bench quality`) from the sources the PyPI sdist ik-llama-cpp-python 0.1.5 vendors, for
# side-by-side benchmarks only (the fastest CPU DeepSeek runtime: MLA-3, fused MoE, run-time
# repacking). Never a dependency of the project or its CI.
#   usage: setup_ik_llamacpp_peer.sh [DIR]     (default DIR: $HOME/.cache/mla-peers/ik_llamacpp)
# Afterwards: DIR/bin/llama-batched-bench ..., DIR/src/convert_hf_to_gguf.py, DIR/venv/bin/python.
# About 25 minutes of compiling on 2 cores. Needs cmake, g++.
# Two mendings of the sdist: it lacks common/cmake/build-info-gen-cpp.cmake (written here: it
# fills common/build-info.cpp.in), and ik decides "V2-Lite: no q LoRA" by n_layer == 26 or 27,
# which a checkpoint with fewer layers (the benchmark's 3-layer one) fails; here the decision is
# the model's own: no attention.q_lora_rank key in the GGUF (n_lora_q == 0), in the three places.
set -euo pipefail
DIR=${1:-$HOME/.cache/mla-peers/ik_llamacpp}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$DIR" && cd "$DIR"
if [ ! -d src ]; then
  python3 -m pip download -q --no-binary :all: --no-deps -d dl ik-llama-cpp-python==0.1.5
  tar xzf dl/ik_llama_cpp_python-0.1.5.tar.gz
  ln -sfn "$DIR/ik_llama_cpp_python-0.1.5/vendor/ik_llama.cpp" src
fi
mkdir -p src/common/cmake
cat > src/common/cmake/build-info-gen-cpp.cmake <<'CMAKE'
set(BUILD_NUMBER 0)
set(BUILD_COMMIT "ik-llama-cpp-python-0.1.5")
set(BUILD_COMPILER "${CMAKE_C_COMPILER_ID} ${CMAKE_C_COMPILER_VERSION}")
set(BUILD_TARGET "x86_64")
configure_file(${CMAKE_CURRENT_LIST_DIR}/../build-info.cpp.in ${CMAKE_CURRENT_LIST_DIR}/../build-info.cpp)
CMAKE
python3 - "$DIR/src" <<'PY'
import sys, pathlib
root = pathlib.Path(sys.argv[1])
edits = {
    "src/llama-hparams.cpp": [(
        "                if (!is_lite) {\n                    ml.get_key(LLM_KV_ATTENTION_Q_LORA_RANK, hparams.n_lora_q);\n                }\n",
        "                ml.get_key(LLM_KV_ATTENTION_Q_LORA_RANK, hparams.n_lora_q, false);  // absent: no q LoRA (V2-Lite)\n"
        "                (void)is_lite;\n")],
    "src/llama-build-context.cpp": [("    bool is_lite = (hparams.n_layer == 27 || hparams.n_layer == 26);",
                                     "    bool is_lite = hparams.n_lora_q == 0;  // mla-export peer: no q LoRA, whatever the layer count")],
    "src/llama-load-tensors.cpp": [("    const bool is_lite = (hparams.n_layer == 27 || hparams.n_layer == 26);",
                                    "    const bool is_lite = hparams.n_lora_q == 0;  // mla-export peer: no q LoRA, whatever the layer count")],
}
for rel, pairs in edits.items():
    p = root / rel
    text = p.read_text()
    for old, new in pairs:
        if new in text:
            continue  # mended by an earlier run
        if old not in text:
            sys.exit(f"setup_ik_llamacpp_peer: {rel} is not the 0.1.5 source this script mends")
        text = text.replace(old, new)
    p.write_text(text)
PY
cmake -S src -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
cmake --build build -j2 --target llama-batched-bench llama-bench llama-sweep-bench llama-quantize llama-perplexity >build.log 2>&1 \
  || { tail -30 build.log; exit 1; }
mkdir -p bin && for t in llama-batched-bench llama-bench llama-sweep-bench llama-quantize llama-perplexity; do
  ln -sfn "$DIR/build/bin/$t" "bin/$t"; done
[ -x venv/bin/python ] || python3 -m venv venv
venv/bin/pip install -q numpy sentencepiece safetensors "transformers>=4.45" torch==2.13.0 2>&1 | tail -2 || true
venv/bin/pip install -q -e src/gguf-py
cp "$HERE/convert.py" "$DIR/convert.py"
echo "tools: $DIR/bin ; convert: $DIR/venv/bin/python $DIR/convert.py CKPT --outtype bf16 --outfile X.gguf"
