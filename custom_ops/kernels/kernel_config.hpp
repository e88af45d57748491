// The kernels' switchboard: which code every kernel call runs, in one struct behind one pointer.
//
// The f32 table (isa.hpp: attention, indexer, cache rows), the integer-GEMM table (qgemm.hpp:
// MlaMoeExperts, MlaQLinear), whether AMX tiles run, which engine takes the absorbed bf16 decode
// rows, and the preferred MlaQLinear layout are chosen together from the CPU (cpu_features.hpp)
// and one setting: the variable MLA_EXPORT_KERNELS, read once, at the first kernel call, or
// configure() (exported to Python as MlaExportKernels), which replaces the whole configuration
// between kernel calls. A setting names only what it forces; the rest is the best the build and
// CPU run. The grammar (docs/ENVIRONMENT.md):
//
//   isa=auto|generic|avx2|avx512        the f32 and integer tables (the same ISA for both)
//   amx=auto|0|1                        AMX tiles (bf16 decode rows, indexer, int8 / fp8 products)
//   decode_rows=auto|f32|bf16|amx       the absorbed bf16 decode rows' engine: f32 kernels,
//                                       AVX512-BF16 dots, or AMX tiles (shapes the tiles do not
//                                       cover take the dots where the CPU has them)
//   qlinear=auto|rows4|tile16           the layout the runtime rewrites MlaQLinear's (and MoE) integer
//                                       weights into (read by Python's qlinear_tiles.py; auto: tile16
//                                       on VNNI CPUs under a bf16 hint, as that module says)
//   fp8_codes=auto|shift|lut            how the fp8 bf16 dots widen e4m3 codes to bf16: bit shifts
//                                       (any AVX512-BF16 CPU) or AVX512-VBMI byte-table lookups
//                                       (fewer instructions a weight; auto: lut where the CPU has VBMI)
//
// e.g. MLA_EXPORT_KERNELS="isa=avx2" or "amx=0,decode_rows=f32". Asking for what this build or CPU
// cannot run is an error naming the key, never a silent fallback (a test or benchmark that asked
// for it would otherwise measure something else).
#pragma once

#include <cstddef>
#include <string>

#include "isa.hpp"
#include "qgemm.hpp"

namespace mla {

enum class DecodeRowsEngine { f32, bf16, amx };  // ordered: an engine may fall back to those before it
enum class QLinearLayout { automatic, rows4, tile16 };

struct KernelConfig {
    const IsaKernels* f32;     // the f32 table
    const QgemmIsa* qgemm;     // the integer-GEMM table of the same ISA
    bool amx_bf16, amx_int8;   // AMX tiles allowed: CPU unit, the OS grant, the avx512 table, amx != 0
    DecodeRowsEngine decode_rows;
    QLinearLayout qlinear;
    bool fp8_lut;              // fp8 codes widened by VBMI byte lookups in the bf16 dots (else shifts)
};

// The configuration every kernel call uses (resolved from MLA_EXPORT_KERNELS at the first call;
// throws mla::Error naming the variable on a setting that does not parse or cannot run).
const KernelConfig& kernels();
inline const IsaKernels& isa() { return *kernels().f32; }

// Replaces the configuration with `spec` resolved as above (call it between kernel calls, not
// during one); throws mla::Error naming the bad key and nothing changes.
void configure(const std::string& spec);

// The configuration in the setting's own grammar, every key resolved ("isa=avx512,amx=0,...").
std::string describe(const KernelConfig& config);

// The runtimes' exported C calls (MlaExportKernels, MlaExportOrtKernels): configure(spec) unless
// spec is null or empty, then describe(kernels()) into out (truncated to out_len - 1 bytes); 1 on
// success, 0 with the error's message in out. Never throws.
int kernels_call(const char* spec, char* out, size_t out_len);
// cpu_features().names(), kept for the life of the process.
const char* cpu_feature_names();

}  // namespace mla
