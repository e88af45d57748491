"""Optional dependencies and the extra that brings each one in.

The core install (`pip install mla-export`) runs exported models; exporting, the onnxruntime
backend and the server each need an extra. A missing one is reported in one line that names
the extra (`MissingDependency`), never as a traceback: `require()` checks before a feature
starts, and the CLI turns any `ModuleNotFoundError` of a known package into the same line.
"""

from __future__ import annotations

import importlib
import importlib.util

__all__ = ["EXTRA_OF", "MissingDependency", "require", "missing_message"]

# Top-level import name -> the extra of pyproject.toml that installs it.
EXTRA_OF = {
    "onnx": "export",
    "tqdm": "export",
    "safetensors": "test",
    "torch": "test",  # the tests' transformers oracle only
    "transformers": "test",
    "onnxruntime": "onnxruntime",
    "starlette": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "ray": "ray",
    "matplotlib": "bench",
}


class MissingDependency(ImportError):
    """An optional package is not installed; the message says which extra installs it."""


def missing_message(module: str, feature: str) -> str:
    top = module.split(".")[0]
    extra = EXTRA_OF.get(top)
    how = f"pip install 'mla-export[{extra}]'" if extra else f"pip install {top}"
    return f"the '{top}' package is not installed ({feature} needs it): {how}"


def require(module: str, feature: str):
    """Import `module` or raise `MissingDependency` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == module.split(".")[0]:
            raise MissingDependency(missing_message(module, feature), name=e.name) from None
        raise
