"""The C++ kernels' switchboard, asked and set from Python (custom_ops/kernels/kernel_config.hpp).

One configuration decides which code every kernel call runs: the vector table (isa: generic,
avx2, avx512; the f32 and the integer-GEMM table together), AMX tiles on or off, the engine of the
absorbed bf16 decode rows (f32, bf16 dots, amx) and the integer weights' preferred layout. The library
reads it once from MLA_EXPORT_KERNELS (docs/ENVIRONMENT.md) and `configure()` replaces it in
process, in the OpenVINO extension and the onnxruntime op library alike (each holds its own copy of
the kernels). The CPU's features come from the library's own probe, the one the kernels choose by,
never from /proc/cpuinfo.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["KernelConfig", "config", "configure", "cpu_features", "library_config"]

_OUT = 512  # bytes for a configuration or an error message


@dataclass(frozen=True)
class KernelConfig:
    isa: str  # "avx512" | "avx2" | "generic"
    amx: bool
    decode_rows: str  # "f32" | "bf16" | "amx"
    qlinear: str  # "auto" | "rows4" | "tile16"
    fp8_codes: str  # "shift" | "lut": how the fp8 bf16 dots widen e4m3 codes

    @property
    def spec(self) -> str:
        """This configuration in MLA_EXPORT_KERNELS' grammar."""
        return (f"isa={self.isa},amx={int(self.amx)},decode_rows={self.decode_rows},qlinear={self.qlinear},"
                f"fp8_codes={self.fp8_codes}")


def _parse(text: str) -> KernelConfig:
    items = dict(item.split("=", 1) for item in text.split(","))
    return KernelConfig(items["isa"], items["amx"] == "1", items["decode_rows"], items["qlinear"], items["fp8_codes"])


def _call(fn, spec: str | None) -> KernelConfig:
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    out = ctypes.create_string_buffer(_OUT)
    ok = fn(spec.encode() if spec else None, out, _OUT)
    if not ok:
        raise ValueError(out.value.decode())
    return _parse(out.value.decode())


@lru_cache(maxsize=1)
def _ov_library() -> ctypes.CDLL:
    import openvino  # noqa: F401  (loaded first: the extension links libopenvino)

    from .libraries import extension_path

    return ctypes.CDLL(extension_path())


def _ort_library() -> ctypes.CDLL | None:
    from .libraries import ort_ops_path

    path = ort_ops_path()
    return ctypes.CDLL(path) if path else None


def library_config(path: str, spec: str | None = None) -> KernelConfig:
    """The configuration of the onnxruntime op library at `path` (after applying spec, if given)."""
    return _call(ctypes.CDLL(path).MlaExportOrtKernels, spec)


def config() -> KernelConfig:
    """The configuration the kernels run now (MLA_EXPORT_KERNELS' when nothing configured them;
    ValueError with the library's message when that setting is bad)."""
    return _call(_ov_library().MlaExportKernels, None)


def configure(spec: str) -> KernelConfig:
    """Replaces the kernels' configuration in both libraries (between kernel calls, never during
    one): spec in MLA_EXPORT_KERNELS' grammar ("isa=avx2", "amx=0,decode_rows=f32"; keys left out
    are the best this build and CPU run). ValueError naming the bad key, and nothing changes, when
    it does not parse or asks for what cannot run here. Returns the configuration now in use."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"configure: spec must be a non-empty string like 'isa=avx2', got {spec!r}")
    got = _call(_ov_library().MlaExportKernels, spec)
    ort = _ort_library()
    if ort is not None:
        _call(ort.MlaExportOrtKernels, spec)
    return got


@lru_cache(maxsize=1)
def cpu_features() -> frozenset[str]:
    """The CPU features the kernels probed, in /proc/cpuinfo's names ("avx2", "avx512_vnni",
    "amx_int8", ...; only those the OS lets a process use)."""
    fn = _ov_library().MlaExportCpuFeatures
    fn.restype = ctypes.c_char_p
    return frozenset(fn().decode().split())
