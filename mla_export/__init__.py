"""mla-export: DeepSeek-style Multi-head Latent Attention on CPU through OpenVINO and ONNX,
with a paged latent KV cache.

Importing the package is cheap and pulls in neither torch nor openvino; `ov_core()` loads
OpenVINO with the MLA extension, and `LLM` (the offline engine) is imported on first use.
"""

from __future__ import annotations

from .ops.libraries import extension_path, ort_ops_path, ov_core  # noqa: F401 (the package's API, __all__)
from .version import __version__  # noqa: F401 (the package's API)

__all__ = ["extension_path", "ov_core", "ort_ops_path", "LLM", "LLMEngine", "SamplingParams",
           "StructuredOutputsParams", "GuidedDecodingParams"]


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
