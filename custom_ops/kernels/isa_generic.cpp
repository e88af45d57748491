// The baseline build (SSE2 on x86-64, any other CPU): 8-lane vectors that the compiler splits
// into two 4-lane registers, of which x86-64 has only 16. Smaller tiles than AVX2's so the
// accumulators stay in registers: dot 2 query rows x 3 cache rows (6 vectors = 12 xmm), axpy 2
// rows x 3 vectors.
#define MLA_ISA_NS generic
#define MLA_ISA_NAME "generic"
#define MLA_ISA_LANES 8
#define MLA_ISA_DOT_ROWS 2
#define MLA_ISA_DOT_KEYS 3
#define MLA_ISA_AXPY_ROWS 2
#define MLA_ISA_AXPY_VECS 3
#define MLA_ISA_GEMM_MR 6
#include "isa_impl.hpp"

namespace mla {
const IsaKernels& isa_generic() { return generic::table; }
}  // namespace mla
