// The fused MoE op's kernels for the avx2 table (see moe_isa_impl.hpp; flags in CMakeLists.txt).
#define MLA_MOE_NS moe_avx2
#define MLA_MOE_TABLE kMoeIsa
#define MLA_MOE_NAME "avx2"
#include "moe_isa_impl.hpp"
