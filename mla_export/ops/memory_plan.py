"""How much memory a compiled export will hold, checked before compiling.

OpenVINO's CPU plugin keeps int8/int4 weights as they are stored (decompressed on the fly), keeps
bf16/f16 weights narrow only where the CPU computes in that type natively (AVX512-BF16 / AMX /
FP16 capability and a matching inference precision), and widens them to f32 otherwise: a 2-byte
weight then costs 4 bytes resident. The export's contract records its parameter count per storage
type, so the resident size is known before anything is compiled; compiling a model that cannot fit
would otherwise end in the kernel's OOM killer rather than a message.
"""

from __future__ import annotations

from pathlib import Path

from .. import envs

__all__ = ["InsufficientMemoryError", "resident_weight_bytes", "compiled_need_bytes", "available_bytes", "check_fits", "native_float_types",
           "SKIP_ENV"]

SKIP_ENV = "MLA_EXPORT_SKIP_MEMORY_CHECK"
_OVERHEAD = 1.10  # kernels' repacked layouts, per-node scratch, the IR's own structures
_FIXED = 400 << 20  # the OpenVINO runtime and a compiled graph's fixed cost


class InsufficientMemoryError(MemoryError):
    """The compiled model would not fit in the memory this machine has available."""


def native_float_types(device: str = "CPU") -> set[str]:
    """The float weight types the plugin computes in without widening to f32 on this CPU."""
    from .libraries import ov_core

    caps = set(ov_core().get_property(device, "OPTIMIZATION_CAPABILITIES"))
    return {name for cap, name in (("BF16", "bf16"), ("FP16", "f16")) if cap in caps}


def resident_weight_bytes(export: dict, precision: str, weights_file_bytes: int, native: set[str]) -> int:
    """Bytes the compiled model's weights hold at `precision` (the inference precision hint).

    Exports that predate `weight_params` are estimated from the weights file: float weights
    widened from 2 to 4 bytes where the CPU has no native type for them."""
    params = export.get("weight_params")
    if not params:
        dtype = export.get("weight_dtype", "f32")
        widened = dtype in ("bf16", "f16") and (dtype not in native or precision == "f32")
        return weights_file_bytes * (2 if widened else 1)
    total = 0.0
    for kind, n in params.items():
        if kind == "int8":
            total += n * 1.0
        elif kind == "fp8":
            total += n * (1.0 + 5.0 / 128)  # e4m3 codes, an f32 scale and a (zero) u8 per 128 inputs
        elif kind == "int4":
            groups = export.get("int4_group_sizes") or [128]
            total += n * (0.5 + 4.5 / min(groups))  # codes, plus an f32 scale and a u4 zero point per group
        elif kind in ("bf16", "f16") and kind in native and precision == kind:
            total += n * 2.0
        else:  # f32, or a 2-byte type the plugin widens
            total += n * 4.0
    return int(total)


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def compiled_need_bytes(export: dict, precision: str, weights_file_bytes: int, native: set[str] | None = None) -> int:
    """Memory a compiled model takes besides its KV cache: the resident weights plus the plugin's
    own share (repacked layouts, scratch, the runtime). The one estimate check_fits holds against
    MemAvailable and the benchmark waits for."""
    resident = resident_weight_bytes(export, precision, weights_file_bytes,
                                     native_float_types() if native is None else native)
    return int(resident * _OVERHEAD) + _FIXED


def check_fits(export: dict, precision: str, weights_file: Path, native: set[str] | None = None) -> int:
    """Raise InsufficientMemoryError when the compiled weights cannot fit; returns the estimate.
    Call it after the cache arrays are allocated (MemAvailable then already excludes them)."""
    size = weights_file.stat().st_size if weights_file.is_file() else 0
    need = compiled_need_bytes(export, precision, size, native)
    have = available_bytes()
    if have is not None and need > have and not envs.get(SKIP_ENV):
        gib = 1 << 30
        fmt = export.get("weight_format", export.get("weight_dtype", "?"))
        hint = ("export with --weight-format int4 (0.5 byte per weight) or a smaller cache"
                if fmt != "int4" else "use a smaller cache (num_blocks / kv_cache_memory) or free memory")
        raise InsufficientMemoryError(
            f"the compiled model needs about {need / gib:.1f} GiB for its {fmt} weights at {precision} inference "
            f"precision, but only {have / gib:.1f} GiB is available after the KV cache: {hint} "
            f"(set {SKIP_ENV}=1 to compile anyway)")
    return need
