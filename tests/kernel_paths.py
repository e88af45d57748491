"""The kernel paths this CPU runs, and switching between them in process (mla_export.ops.kernel_config).

What the CPU has comes from the library's own probe (the one the kernels choose by); which paths
are expected follows from it here, independently of the library's resolution, so a library that
refused a path the CPU has fails the tests instead of skipping it.
"""

from __future__ import annotations

from contextlib import contextmanager

from mla_export.ops import kernel_config

FEATURES = kernel_config.cpu_features()
HAS = {
    "generic": True,
    "avx2": {"avx2", "fma", "f16c"} <= FEATURES,
    "avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"} <= FEATURES,
}
TABLES = [isa for isa, runs in HAS.items() if runs]
BF16_DOTS = HAS["avx512"] and "avx512_bf16" in FEATURES
AMX = HAS["avx512"] and {"amx_tile", "amx_bf16", "amx_int8"} <= FEATURES

# Every path: each vector table (f32 and integer GEMM together), and on the AVX-512 one each engine
# of the bf16 decode rows (f32 kernels, AVX512-BF16 dots, AMX tiles) the CPU has.
PATHS = [f"isa={isa},decode_rows=f32,amx=0" if isa == "avx512" else f"isa={isa}" for isa in TABLES]
if BF16_DOTS:
    PATHS.append("isa=avx512,decode_rows=bf16,amx=0")
if AMX:
    PATHS.append("isa=avx512,decode_rows=amx,amx=1")


def cpu_has(flag: str) -> bool:
    return flag in FEATURES


@contextmanager
def running(spec: str):
    """The kernels configured by spec for the block (checked to be what was asked), then restored."""
    before = kernel_config.config().spec
    got = kernel_config.configure(spec)
    for item in spec.split(","):
        key, value = item.split("=")
        if value != "auto":
            assert str(getattr(got, key) if key != "amx" else int(got.amx)) == value, (spec, got)
    try:
        yield got
    finally:
        kernel_config.configure(before)


def int8_activations(isa: str | None = None) -> bool:
    """Whether the integer-weight ops run int8 activations under compute="bf16" on table isa (the
    one in use when None), as qmode() in qmatmul.cpp decides: the AVX-512 table on VNNI CPUs, or
    the AVX2 table (vpmaddubsw)."""
    isa = isa or kernel_config.config().isa
    return isa == "avx2" or (isa == "avx512" and cpu_has("avx512_vnni"))
