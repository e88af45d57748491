#!/usr/bin/env bash
# Fetch onnxruntime's C/C++ API headers for building the mla-export onnxruntime custom-op
# library (the onnxruntime wheel ships none).
#
#   tools/fetch_ort_headers.sh [DEST]        # default DEST: build/ort-headers
#
# Downloads Debian's libonnxruntime-dev .deb with a private apt state (its own sources list,
# lists and cache under a temp dir: the system's apt state and packages are not touched, no root
# needed for anything but what apt-get download itself needs) and unpacks only the headers into
# DEST/include/onnxruntime. On success prints the include dir on the last line of stdout
# (DEST/include/onnxruntime) and exits 0; on any failure exits non-zero.
#
# The headers must be no newer than the onnxruntime that will load the library (the C API only
# grows; the library asks the runtime for the headers' API version). Default: Debian trixie's
# 1.21 (a stable release, so it does not move). Override with
#   MLA_ORT_DEBIAN_SUITES="trixie sid"   suites to look in
#   MLA_ORT_MAX_VERSION=1.32             the newest acceptable onnxruntime version
# The highest version found that is <= MLA_ORT_MAX_VERSION is used.
set -euo pipefail

DEST="${1:-build/ort-headers}"
SUITES="${MLA_ORT_DEBIAN_SUITES:-trixie}"
MAX_VERSION="${MLA_ORT_MAX_VERSION:-1.32}"
MIRROR="${MLA_ORT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

if [ -f "$DEST/include/onnxruntime/onnxruntime_cxx_api.h" ]; then
    echo "$(cd "$DEST/include/onnxruntime" && pwd)"
    exit 0
fi
for tool in apt-get apt-cache dpkg-deb dpkg; do
    command -v "$tool" >/dev/null || { echo "fetch_ort_headers: $tool not found (needs a Debian-like system)" >&2; exit 2; }
done
[ -r "$KEYRING" ] || { echo "fetch_ort_headers: $KEYRING not found (debian-archive-keyring)" >&2; exit 2; }

TMP="$(mktemp -d "${TMPDIR:-/tmp}/mla-ort-apt.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/state/lists/partial" "$TMP/cache/archives/partial" "$TMP/etc/sources.list.d" \
         "$TMP/etc/preferences.d" "$TMP/dl" "$TMP/x"
touch "$TMP/state/status"
for s in $SUITES; do
    echo "deb [signed-by=$KEYRING] $MIRROR $s main"
done > "$TMP/etc/sources.list"
APT_OPTS=(
    -o "Dir::State=$TMP/state" -o "Dir::State::status=$TMP/state/status"
    -o "Dir::Cache=$TMP/cache" -o "Dir::Etc::SourceList=$TMP/etc/sources.list"
    -o "Dir::Etc::SourceParts=$TMP/etc/sources.list.d" -o "Dir::Etc::Preferences=$TMP/etc/preferences"
    -o "Dir::Etc::PreferencesParts=$TMP/etc/preferences.d" -o "Acquire::Languages=none"
    -o "APT::Get::List-Cleanup=0" -o "Debug::NoLocking=1"
)
# apt drops privileges to _apt for downloads, which cannot write into our private temp dir.
if [ "$(id -u)" = 0 ]; then APT_OPTS+=(-o "APT::Sandbox::User=root"); fi

echo "fetch_ort_headers: apt-get update ($SUITES) with a private state in $TMP" >&2
apt-get "${APT_OPTS[@]}" -qq update >&2

# Highest available version <= MAX_VERSION.
VERSION=""
while read -r v; do
    [ -n "$v" ] || continue
    upstream="${v#*:}"; upstream="${upstream%%+*}"; upstream="${upstream%%-*}"
    if dpkg --compare-versions "$upstream" le "$MAX_VERSION"; then VERSION="$v"; break; fi
done < <(apt-cache "${APT_OPTS[@]}" madison libonnxruntime-dev | awk -F'|' '{gsub(/ /,"",$2); print $2}' |
         sort -u | sort -r -V)
[ -n "$VERSION" ] || { echo "fetch_ort_headers: no libonnxruntime-dev <= $MAX_VERSION in $SUITES" >&2; exit 3; }

echo "fetch_ort_headers: downloading libonnxruntime-dev=$VERSION" >&2
(cd "$TMP/dl" && apt-get "${APT_OPTS[@]}" -qq download "libonnxruntime-dev=$VERSION" >&2)
dpkg-deb -x "$TMP"/dl/libonnxruntime-dev_*.deb "$TMP/x"
[ -f "$TMP/x/usr/include/onnxruntime/onnxruntime_cxx_api.h" ] ||
    { echo "fetch_ort_headers: the package holds no onnxruntime_cxx_api.h" >&2; exit 4; }

mkdir -p "$DEST/include"
rm -rf "$DEST/include/onnxruntime.tmp"
cp -r "$TMP/x/usr/include/onnxruntime" "$DEST/include/onnxruntime.tmp"
echo "$VERSION" > "$DEST/include/onnxruntime.tmp/DEBIAN_VERSION"
mv "$DEST/include/onnxruntime.tmp" "$DEST/include/onnxruntime"   # atomic for concurrent builds
echo "fetch_ort_headers: headers of onnxruntime $VERSION in $DEST/include/onnxruntime" >&2
echo "$(cd "$DEST/include/onnxruntime" && pwd)"
