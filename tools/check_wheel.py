"""Check a built mla-export wheel is the one users install without a compiler.

    python tools/check_wheel.py [--auditwheel PATH] WHEEL

Fails (exit 1, one line per problem) unless:
  - the tag is py3-none-manylinux_X_Y_x86_64 (filename and WHEEL metadata agree);
  - both libraries are inside (mla_export/lib/libmla_export_ov.so and libmla_export_ort.so) and no
    other shared library is (libopenvino and onnxruntime come from their own wheels);
  - the OpenVINO extension still finds the openvino wheel's libraries: its RUNPATH holds
    $ORIGIN/../../openvino/libs (site-packages/mla_export/lib -> site-packages/openvino/libs);
  - neither library needs anything outside the manylinux system set but libopenvino (the
    onnxruntime one needs no libonnxruntime: the runtime that loads it hands it the API);
  - `auditwheel show` finds the libraries' symbol versions consistent with the manylinux tag it
    carries, and no external library but libopenvino.
Used by tools/build_wheel.sh and tests/test_wheel_install.py.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LIBS = ("mla_export/lib/libmla_export_ov.so", "mla_export/lib/libmla_export_ort.so")
OPENVINO_RUNPATH = "$ORIGIN/../../openvino/libs"
# The libraries every manylinux system provides (auditwheel's policy lists them); ours need no more.
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2",
               "libpthread.so.0", "libdl.so.2", "librt.so.1"}
TAG = re.compile(r"^mla_export-[^-]+-py3-none-(manylinux_\d+_\d+_x86_64)\.whl$")


def dynamic_section(lib: Path) -> tuple[list[str], list[str]]:
    """(NEEDED entries, RUNPATH/RPATH entries) of an ELF library, read with readelf."""
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    paths = [p for m in re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", out)
             for p in m.split(":")]
    return needed, paths


def audit(wheel: Path, plat: str, auditwheel: str) -> list[str]:
    """auditwheel's verdict: the symbol versions allow `plat`, and the only library it would have
    to graft to call the wheel manylinux is libopenvino (which is why its overall tag is
    linux_x86_64: auditwheel show has no --exclude; repair was given one)."""
    show = subprocess.run([auditwheel, "show", "--json", str(wheel)], capture_output=True, text=True)
    if show.returncode != 0:
        return [f"auditwheel show failed: {show.stderr.strip() or show.stdout.strip()}"]
    report = json.loads(show.stdout)
    problems = []
    if report["sym_tag"] != plat:
        problems.append(f"auditwheel: the libraries' symbol versions allow {report['sym_tag']}, the wheel says {plat}")
    external = sorted(report["external_libs"])
    if any(not name.startswith("libopenvino") for name in external):
        problems.append(f"auditwheel: external libraries other than libopenvino: {external}")
    if report.get("unsupported_isa"):
        problems.append("auditwheel: the libraries need an ISA extension beyond baseline x86_64 outside run-time dispatch")
    if not problems:
        print(f"auditwheel show: symbol versions -> {report['sym_tag']}; external: {external} (the openvino wheel's)")
    return problems


def check(wheel: Path, auditwheel: str | None) -> list[str]:
    problems = []
    m = TAG.match(wheel.name)
    if not m:
        return ["the tag is not py3-none-manylinux_X_Y_x86_64"]
    plat = m.group(1)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        wheel_meta = next((n for n in names if n.endswith(".dist-info/WHEEL")), None)
        tags = re.findall(r"^Tag: (\S+)$", zf.read(wheel_meta).decode(), re.M) if wheel_meta else []
        if tags != [f"py3-none-{plat}"]:
            problems.append(f"WHEEL metadata tags {tags} do not match the filename's py3-none-{plat}")
        for lib in LIBS:
            if lib not in names:
                problems.append(f"{lib} is not in the wheel")
        extra = [n for n in names if re.search(r"\.so(\.|$)", n) and n not in LIBS]
        if extra:
            problems.append(f"shared libraries vendored beside ours: {extra}")
        with tempfile.TemporaryDirectory() as tmp:
            for lib in LIBS:
                if lib not in names:
                    continue
                path = Path(zf.extract(lib, tmp))
                needed, runpath = dynamic_section(path)
                foreign = [n for n in needed if n not in SYSTEM_LIBS and not n.startswith("libopenvino.so.")]
                if foreign:
                    problems.append(f"{lib} needs {foreign} beyond the manylinux system libraries and libopenvino")
                if lib.endswith("_ov.so"):
                    if OPENVINO_RUNPATH not in runpath:
                        problems.append(f"{lib}: RUNPATH {runpath} lacks {OPENVINO_RUNPATH} (libopenvino not found)")
                    if not any(n.startswith("libopenvino.so.") for n in needed):
                        problems.append(f"{lib} does not link libopenvino (needed: {needed})")
    if auditwheel:
        problems += audit(wheel, plat, auditwheel)
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--auditwheel", help="auditwheel executable (default: the one on PATH, if any)")
    args = ap.parse_args(argv)
    if not args.wheel.is_file():
        print(f"check_wheel: wheel {args.wheel} does not exist", file=sys.stderr)
        return 1
    if shutil.which("readelf") is None:
        print("check_wheel: readelf (binutils) is needed to read the libraries' dynamic sections", file=sys.stderr)
        return 1
    problems = check(args.wheel, args.auditwheel or shutil.which("auditwheel"))
    for p in problems:
        print(f"check_wheel: {args.wheel.name}: {p}", file=sys.stderr)
    if not problems:
        print(f"check_wheel: ok: {args.wheel.name}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
