"""mla-export: DeepSeek-style Multi-head Latent Attention on CPU through OpenVINO and ONNX,
with a paged latent KV cache.

Importing the package is cheap and pulls in neither torch nor openvino; `ov_core()` loads
OpenVINO with the MLA extension, and `LLM` (the offline engine) is imported on first use.
"""

from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.1.0"
__all__ = ["extension_path", "ov_core", "ort_ops_path", "LLM", "LLMEngine", "SamplingParams",
           "StructuredOutputsParams", "GuidedDecodingParams"]

_LIB_DIR = Path(__file__).resolve().parent / "lib"


def _find_library(stem: str) -> Path | None:
    """The installed shared library `lib<stem>.so` inside the package (wheel or editable)."""
    from . import envs

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


def extension_path() -> str:
    """Path of the OpenVINO extension library (the three MLA ops and their ONNX mapping)."""
    p = _find_library("mla_export_ov")
    if p is None:
        raise FileNotFoundError(
            "the mla-export OpenVINO extension (libmla_export_ov.so) is not installed; "
            "reinstall the package with `pip install .` so that it is built")
    return str(p)


def ort_ops_path() -> str | None:
    """Path of the onnxruntime custom-op library, or None when it was not built."""
    p = _find_library("mla_export_ort")
    return str(p) if p else None


_CORE = None


def ov_core():
    """An `openvino.Core` with the MLA extension added (created once, then shared)."""
    global _CORE
    if _CORE is None:
        import openvino as ov

        core = ov.Core()
        core.add_extension(extension_path())
        _CORE = core
    return _CORE


def __getattr__(name: str):
    # The engine is imported lazily so `import mla_export` stays light.
    if name == "LLM":
        from .runtime.llm import LLM

        return LLM
    if name in ("LLMEngine", "SamplingParams"):
        from .runtime import engine

        return getattr(engine, name)
    if name in ("StructuredOutputsParams", "GuidedDecodingParams"):
        from .runtime import structured_output

        return getattr(structured_output, name)
    raise AttributeError(f"module 'mla_export' has no attribute {name!r}")
