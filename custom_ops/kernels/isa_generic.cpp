// The baseline build (SSE2 on x86-64): the same tiles as AVX2, each 8-lane vector in two xmm.
#define MLA_ISA_NS generic
#define MLA_ISA_NAME "generic"
#define MLA_ISA_LANES 8
#define MLA_ISA_DOT_ROWS 4
#define MLA_ISA_DOT_KEYS 3
#define MLA_ISA_AXPY_ROWS 4
#define MLA_ISA_AXPY_VECS 3
#define MLA_ISA_GEMM_MR 6
#include "isa_impl.hpp"

namespace mla {
const IsaKernels& isa_generic() { return generic::table; }
}  // namespace mla
