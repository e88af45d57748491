// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c (see CMakeLists.txt);
// only called when the CPU has them (kernel_config.cpp). 16 f32 lanes and 32 zmm registers:
// dot tiles of 4 query rows x 4 cache rows (16 accumulators; a 64-row chunk splits evenly),
// axpy tiles of 4 rows x 4 vectors (64 columns: r = 512 in 8 tiles, 16 accumulators), gemm
// micro-kernels of up to 8 rows of one 16-wide panel (8 accumulators).
#define MLA_ISA_NS avx512
#define MLA_ISA_NAME "avx512"
#define MLA_ISA_LANES 16
#define MLA_ISA_DOT_ROWS 4
#define MLA_ISA_DOT_KEYS 4
#define MLA_ISA_AXPY_ROWS 4
#define MLA_ISA_AXPY_VECS 4
#define MLA_ISA_GEMM_MR 8
// GCC 12's avx512fintrin.h starts many intrinsics from _mm512_undefined_*(), which it then
// flags as maybe-uninitialized (GCC bug 105593, fixed in 13): not our code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "isa_impl.hpp"

namespace mla {
const IsaKernels* isa_avx512() { return &avx512::table; }
}  // namespace mla
