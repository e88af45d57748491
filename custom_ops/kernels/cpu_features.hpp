// The one CPU probe of the kernels (as llama.cpp's cpu-feats): which instruction sets this CPU
// has and the OS lets a process use (CPUID for the units, XGETBV for the register state the OS
// saves), read once. Everything that chooses a kernel by CPU asks here (kernel_config.cpp), and
// Python asks the library for the same list (MlaExportCpuFeatures) instead of reading
// /proc/cpuinfo, so the two can never disagree.
#pragma once

#include <string>

namespace mla {

struct CpuFeatures {
    bool avx2 = false, fma = false, f16c = false;                          // the avx2 table
    bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;  // the avx512 table
    bool avx512_vnni = false;  // int8 activations on the avx512 table (vpdpbusd)
    bool avx512_bf16 = false;  // bf16 dot products (vdpbf16ps): decode rows, fp8 codes on bf16 rows
    bool avx512_vbmi = false;  // byte permutes (vpermi2b): fp8 codes widened by table lookups
    bool amx_tile = false, amx_bf16 = false, amx_int8 = false;  // the AMX units (the OS grant: amx_granted())

    bool has_avx2_table() const { return avx2 && fma && f16c; }
    bool has_avx512_table() const { return has_avx2_table() && avx512f && avx512bw && avx512vl && avx512dq; }
    // The features present, space-separated, in /proc/cpuinfo's names ("avx2 fma ... amx_int8").
    std::string names() const;
};

const CpuFeatures& cpu_features();

// Asks Linux once for the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, which OpenVINO's
// own AMX kernels also request); true when granted. Only asked when AMX is about to be enabled.
bool amx_granted();

}  // namespace mla
