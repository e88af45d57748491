// Compiled with -mavx2 -mfma -mf16c (see CMakeLists.txt); only called when the CPU has them.
// 16 ymm registers: dot tiles of 4 query rows x 3 cache rows (12 accumulators), axpy tiles of
// 4 rows x 3 vectors (12 accumulators, 3 row loads + 4 broadcasts per 12 FMAs; 6 x 2 needed 8,
// and H = 16 then ended in a 4 x 2 tile: in cache 73 -> 83 GFLOP/s at H = 16).
#define MLA_ISA_NS avx2
#define MLA_ISA_NAME "avx2"
#define MLA_ISA_LANES 8
#define MLA_ISA_DOT_ROWS 4
#define MLA_ISA_DOT_KEYS 3
#define MLA_ISA_AXPY_ROWS 4
#define MLA_ISA_AXPY_VECS 3
#define MLA_ISA_GEMM_MR 6
#include "isa_impl.hpp"

namespace mla {
const IsaKernels* isa_avx2() { return &avx2::table; }
}  // namespace mla
