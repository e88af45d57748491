"""Every environment variable mla-export reads, in one table (as vLLM's envs.py): its name, who
reads it (this package's Python, the C++ kernels, the benchmark's peers), its default and what
it does. Python reads them only through here: `envs.MLA_EXPORT_VERIFY` (the parsed value, read
at the moment of the call). A value that does not parse is a ValueError naming the variable,
never a silent default. docs/ENVIRONMENT.md is this table for readers;
tests/test_envs.py keeps the two, and every getenv of the C++ sources, in step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["EnvVar", "VARIABLES", "RETIRED", "check_retired", "get"]


def _flag(name: str, text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {text!r}")
    return text == "1"


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        text = text.strip()
        if text not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {text!r}")
        return text
    return parse


def _text(name: str, text: str) -> str:
    return text


def _positive_seconds_or_default(name: str, text: str) -> float:
    # vLLM reads it leniently (its own default for what does not parse); the server does the same
    try:
        v = float(text)
    except ValueError:
        return 10.0
    return v if v > 0 else 10.0


@dataclass(frozen=True)
class EnvVar:
    name: str
    reader: str  # "python" (read through this module), "kernels" (the C++ ops' getenv), "bench"
    default: Any  # the value when unset or empty
    parse: Callable[[str, str], Any]
    doc: str


_VARS = [
    EnvVar("MLA_EXPORT_LIB_DIR", "python", None, _text,
           "Directory holding libmla_export_ov.so / libmla_export_ort.so to load instead of the installed ones."),
    EnvVar("MLA_EXPORT_VERIFY", "python", None, _choice("sampled", "full", "none"),
           "The load-time check of an export's files when no --verify / verify= is given: sampled (default), "
           "full (every byte against its SHA-256), none (sizes only)."),
    EnvVar("MLA_EXPORT_WEIGHTS_MMAP", "python", False, _flag,
           "1: OpenVINO maps the weights file itself instead of reading it into huge-page memory."),
    EnvVar("MLA_EXPORT_SKIP_MEMORY_CHECK", "python", False, _flag,
           "1: load even when the weights and cache look larger than the memory available."),
    EnvVar("MLA_EXPORT_API_KEY", "python", None, _text,
           "`serve`'s --api-key default: requests to /v1/* need 'Authorization: Bearer KEY'."),
    EnvVar("VLLM_BATCH_INVARIANT", "python", False, _flag,
           "vLLM's switch, honoured: 1 = batch-invariant mode (serve --batch-invariant, "
           "LLM(batch_invariant=True)) when not given explicitly."),
    EnvVar("VLLM_LOG_STATS_INTERVAL", "python", 10.0, _positive_seconds_or_default,
           "Seconds between `serve`'s stats lines (vLLM's variable; not a positive number: 10)."),
    EnvVar("MLA_EXPORT_KERNELS", "kernels", None, _text,
           "Which kernels run, as comma-separated key=value (keys left out: the best this build and CPU run): "
           "isa=generic|avx2|avx512 (the vector tables), amx=0|1 (AMX tiles), decode_rows=f32|bf16|amx (the "
           "absorbed bf16 decode rows' engine), qlinear=rows4|tile16 (the layout of MlaQLinear's and the MoE "
           "experts' integer weights; auto: tile16 under a bf16 hint where runtime/qlinear_tiles.py "
           "has kernels for the format: VNNI CPUs, the experts and int4 not on AMX CPUs). What this build or CPU cannot run is an error naming the key. "
           "Python: mla_export.ops.kernel_config.configure() sets the same in process."),
    EnvVar("MLA_EXPORT_ORT_THREADS", "kernels", None, _text,
           "onnxruntime custom ops' thread count when the session gives none (default: the CPU's)."),
    EnvVar("MLA_LLAMACPP_PEER", "bench", None, _text, "`bench`: the llama.cpp peer's directory."),
    EnvVar("MLA_IK_LLAMACPP_PEER", "bench", None, _text, "`bench`: the ik_llama.cpp peer's directory."),
    EnvVar("MLA_VLLM_PYTHON", "bench", None, _text, "`bench`: the python of the vLLM CPU peer's venv."),
    EnvVar("MLA_OPTIMUM_PEER", "bench", None, _text, "`bench`: the optimum-intel peer's directory."),
    EnvVar("MLA_OPTIMUM_SCRIPT", "bench", None, _text, "`bench`: the optimum-intel peer's export script."),
]
VARIABLES: dict[str, EnvVar] = {v.name: v for v in _VARS}

# Variables no longer read, each refused (when the kernels' libraries load) with its replacement,
# so a script that still sets one learns it, instead of silently running other kernels.
RETIRED: dict[str, str] = {
    "MLA_EXPORT_ISA": "MLA_EXPORT_KERNELS=isa={value}",
    "MLA_EXPORT_AMX": "MLA_EXPORT_KERNELS=amx={value}",
    "MLA_EXPORT_AVX512_BF16": "MLA_EXPORT_KERNELS=decode_rows=f32 (0; or decode_rows=bf16)",
    "MLA_EXPORT_QLINEAR_TILES": "MLA_EXPORT_KERNELS=qlinear=rows4 (0) or qlinear=tile16 (1)",
}


def check_retired() -> None:
    """ValueError naming the first retired variable set in the environment and its replacement."""
    for name, instead in RETIRED.items():
        value = os.environ.get(name)
        if value is not None:
            raise ValueError(f"{name} is no longer read: set {instead.format(value=value)} instead "
                             "(docs/ENVIRONMENT.md)")


def get(name: str) -> Any:
    """The variable's parsed value now (its default when unset or empty)."""
    var = VARIABLES[name]
    text = os.environ.get(name, "")
    if text == "":
        return var.default
    return var.parse(name, text)


def __getattr__(name: str) -> Any:
    if name in VARIABLES:
        return get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
