"""The two shared libraries built from custom_ops/ (the OpenVINO extension with the MLA ops and
their ONNX mapping; the onnxruntime custom-op library), found where a wheel or an editable
install put them, and the one OpenVINO Core with the extension added. The package root
re-exports extension_path, ort_ops_path and ov_core as its API."""

from __future__ import annotations

from pathlib import Path

_LIB_DIR = Path(__file__).resolve().parent.parent / "lib"


def _find_library(stem: str) -> Path | None:
    """The installed shared library `lib<stem>.so` inside the package (wheel or editable)."""
    from .. import envs

    envs.check_retired()  # every load of the kernels passes here: refuse what they no longer read
    env = envs.MLA_EXPORT_LIB_DIR
    dirs = [Path(env)] if env else []
    dirs.append(_LIB_DIR)
    # Editable installs (scikit-build-core) place built files in site-packages/mla_export/lib
    # while the sources stay here; look there too.
    import importlib.util
    import sysconfig

    for key in ("platlib", "purelib"):
        dirs.append(Path(sysconfig.get_paths()[key]) / "mla_export" / "lib")
    spec = importlib.util.find_spec("mla_export")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        dirs.append(Path(loc) / "lib")
    for d in dirs:
        p = d / f"lib{stem}.so"
        if p.is_file():
            return p
    return None


_CHECKED: set[str] = set()


def _check_table(path: str) -> str:
    """path, once its library is known to be built from this package's op table (table.json): a
    library of another build (an older MLA_EXPORT_LIB_DIR, a stale editable install) would take
    attributes it does not know for their defaults, say an MoE's tile16 codes for the 4-row layout,
    and compute a wrong answer without a word."""
    if path not in _CHECKED:
        from . import comparable, library_table, table

        if library_table(path) != comparable(table()):
            raise RuntimeError(f"{path} was built from another op table than this package's "
                               "(mla_export/ops/table.json): rebuild it (pip install ., or cmake --build)")
        _CHECKED.add(path)
    return path


def extension_path() -> str:
    """Path of the OpenVINO extension library (the three MLA ops and their ONNX mapping)."""
    p = _find_library("mla_export_ov")
    if p is None:
        raise FileNotFoundError(
            "the mla-export OpenVINO extension (libmla_export_ov.so) is not installed; "
            "reinstall the package with `pip install .` so that it is built")
    return str(p)


def ort_ops_path() -> str | None:
    """Path of the onnxruntime custom-op library (checked: built from this op table), or None
    when it was not built."""
    p = _find_library("mla_export_ort")
    return _check_table(str(p)) if p else None


_CORE = None


def ov_core():
    """An `openvino.Core` with the MLA extension added (created once, then shared)."""
    global _CORE
    if _CORE is None:
        import openvino as ov

        core = ov.Core()
        core.add_extension(_check_table(extension_path()))  # importing openvino loaded what it links to
        _CORE = core
    return _CORE
