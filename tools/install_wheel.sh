#!/usr/bin/env bash
# Install a wheel built by tools/build_wheel.sh, with its dependencies from the package index,
# into a venv (created when missing). Compiles nothing: every dependency comes as a wheel.
#
#   tools/install_wheel.sh VENV WHEEL
#
# Extras: export (the `export` command), onnxruntime (`--runtime onnxruntime`), serve (`serve`).
# The same command runs in tests/test_wheel_install.py (with no compiler on PATH) and in the
# Dockerfile's runtime stage.
set -euo pipefail
if [ "$#" -ne 2 ]; then
    echo "usage: tools/install_wheel.sh VENV WHEEL" >&2
    exit 2
fi
VENV="$1" WHEEL="$2"
case "$WHEEL" in
    *.whl) ;;
    *) echo "install_wheel: WHEEL must be a .whl file, got $WHEEL" >&2; exit 2 ;;
esac
[ -f "$WHEEL" ] || { echo "install_wheel: wheel $WHEEL does not exist" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/python" -m pip install "$WHEEL[export,onnxruntime,serve]"
