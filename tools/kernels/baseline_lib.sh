#!/bin/bash
# The kernels library of another commit with every symbol of namespace mla renamed into mlb, so it
# links into one binary beside the working tree's (tools/kernels/op_ab.cpp times both in one
# process, alternated: on a shared host whose speed moves minute by minute, two processes a minute
# apart compare the host, not the kernels).
#
#   tools/kernels/baseline_lib.sh REF OUT     # e.g. HEAD~1 /tmp/base: OUT/libbaseline.a, OUT/include
#
# Builds only the mla_kernels target of REF's custom_ops (the configure step needs the openvino
# wheel, as the package's build does: run it in the package's venv). Needs git, cmake, ninja,
# g++, nm and objcopy.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 REF OUT_DIR" >&2
  exit 2
fi
ref=$1
out=$(mkdir -p "$2" && cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git -C "$repo" archive "$ref" custom_ops mla_export/ops/table.json graphs | tar -x -C "$src"
cmake -S "$src/custom_ops" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython3_EXECUTABLE="$(command -v python3)" > "$out/cmake.log"
cmake --build "$src/build" --target mla_kernels >> "$out/cmake.log"
rm -rf "$out/objects" "$out/include"
mkdir -p "$out/objects"
(cd "$out/objects" && ar x "$src/build/libmla_kernels.a")
# Every symbol whose mangled name holds namespace mla (3mla) gets mlb (3mlb), the same length, so
# references between the baseline's objects still meet and none meets the working tree's.
nm "$out"/objects/*.o | awk '{print $NF}' | grep '3mla' | sort -u | awk '{n = $1; gsub("3mla", "3mlb", n); print $1, n}' \
  > "$out/renamed_symbols.txt"
for o in "$out"/objects/*.o; do objcopy --redefine-syms="$out/renamed_symbols.txt" "$o"; done
rm -f "$out/libbaseline.a"
ar rcs "$out/libbaseline.a" "$out"/objects/*.o
cp -r "$src/custom_ops/kernels" "$out/include"
echo "$out/libbaseline.a: the kernels of $(git -C "$repo" rev-parse --short "$ref") in namespace mlb (headers: $out/include)"
