#!/usr/bin/env bash
# A fresh venv with only the `export` extra (no torch, no transformers) exports the tiny preset
# and a checkpoint directory as downloaded (bf16 safetensors, config.json, tokenizer), and
# generates from both: the README's first command without torch.
#
#   tools/check_fresh_install.sh [WORK_DIR]     # default: a temporary directory, removed after
#
# Builds the package in its own build directory (the editable install's build/ is not touched).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-$(mktemp -d)}"
[ -n "${1:-}" ] || trap 'rm -rf "$WORK"' EXIT
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q -e ".[export]" --config-settings=build-dir="$WORK/build"
if "$WORK/venv/bin/python" -c "import torch" 2>/dev/null || "$WORK/venv/bin/python" -c "import transformers" 2>/dev/null; then
    echo "check_fresh_install: torch or transformers came with the export extra" >&2
    exit 1
fi
"$WORK/venv/bin/mla-export" export --preset tiny -o "$WORK/tiny" -q
"$WORK/venv/bin/mla-export" generate "$WORK/tiny" --prompt "The quick brown fox" --max-tokens 8
"$WORK/venv/bin/python" -c "import sys; from mla_export.checkpoint.presets import make_numpy_checkpoint as m; m(sys.argv[1], 'deepseek_v2', seed=4, dtype='bfloat16')" "$WORK/ckpt"
"$WORK/venv/bin/mla-export" export "$WORK/ckpt" -o "$WORK/ckpt-out" -q
"$WORK/venv/bin/mla-export" generate "$WORK/ckpt-out" --prompt "Once upon a time" --max-tokens 8
echo "check_fresh_install: ok (export --preset tiny and a bf16 checkpoint directory, generate, without torch)"
