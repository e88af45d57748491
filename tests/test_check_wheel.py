"""tools/check_wheel.py refuses a wheel users could not install without a compiler, or whose
libraries would not load: each cause is one wheel built here from the installed libraries
(the package's own libmla_export_ov.so and libmla_export_ort.so), with one thing wrong."""

from __future__ import annotations

import importlib.util
import shutil
import zipfile
from pathlib import Path

import pytest

import mla_export

REPO = Path(__file__).resolve().parent.parent
PLAT = "manylinux_2_34_x86_64"

pytestmark = pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) reads the libraries")


def _check_wheel():
    spec = importlib.util.spec_from_file_location("check_wheel", REPO / "tools" / "check_wheel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check_wheel = _check_wheel()


def make_wheel(tmp_path: Path, *, tag: str = f"py3-none-{PLAT}", meta_tag: str | None = None,
               ov: str | None = None, ort: str | None = None, extra: dict[str, bytes] | None = None) -> Path:
    """A wheel holding the installed libraries (or the given files in their places)."""
    ov = ov if ov is not None else mla_export.extension_path()
    ort = ort if ort is not None else mla_export.ort_ops_path()
    assert ort, "the onnxruntime custom-op library is not built in this install"
    path = tmp_path / f"mla_export-0.1.0-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mla_export/__init__.py", "")
        zf.writestr("mla_export-0.1.0.dist-info/WHEEL",
                    f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {meta_tag or tag}\n")
        if ov != "absent":
            zf.write(ov, "mla_export/lib/libmla_export_ov.so")
        if ort != "absent":
            zf.write(ort, "mla_export/lib/libmla_export_ort.so")
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return path


class TestAcceptsTheRealLayout:
    def test_both_libraries_with_the_openvino_runpath(self, tmp_path):
        assert check_wheel.check(make_wheel(tmp_path), None) == []


class TestRefusesAPythonSpecificOrPlainLinuxTag:
    @pytest.mark.parametrize("tag", ["cp311-cp311-manylinux_2_34_x86_64", "py3-none-linux_x86_64"])
    def test_tag(self, tmp_path, tag):
        assert check_wheel.check(make_wheel(tmp_path, tag=tag), None) == [
            "the tag is not py3-none-manylinux_X_Y_x86_64"]

    def test_metadata_disagrees_with_filename(self, tmp_path):
        problems = check_wheel.check(make_wheel(tmp_path, meta_tag="cp311-cp311-linux_x86_64"), None)
        assert len(problems) == 1 and "WHEEL metadata tags" in problems[0]


class TestRefusesAMissingLibrary:
    @pytest.mark.parametrize("which", ["ov", "ort"])
    def test_missing(self, tmp_path, which):
        problems = check_wheel.check(make_wheel(tmp_path, **{which: "absent"}), None)
        assert problems == [f"mla_export/lib/libmla_export_{which}.so is not in the wheel"]


class TestRefusesVendoredLibraries:
    def test_libopenvino_copied_in(self, tmp_path):
        problems = check_wheel.check(make_wheel(tmp_path, extra={"mla_export.libs/libopenvino-1a2b.so.2641": b"x"}), None)
        assert len(problems) == 1 and "vendored" in problems[0] and "libopenvino" in problems[0]


class TestRefusesAnExtensionThatCannotFindOpenVINO:
    def test_no_runpath_no_libopenvino(self, tmp_path):
        # The onnxruntime library in the OpenVINO extension's place: no RUNPATH, no libopenvino.
        problems = check_wheel.check(make_wheel(tmp_path, ov=mla_export.ort_ops_path()), None)
        assert any("RUNPATH" in p for p in problems), problems
        assert any("does not link libopenvino" in p for p in problems), problems
