// The fused MoE op's kernels for the generic table (see moe_isa_impl.hpp; flags in CMakeLists.txt).
#define MLA_MOE_NS moe_generic
#define MLA_MOE_TABLE kMoeIsa
#define MLA_MOE_NAME "generic"
#include "moe_isa_impl.hpp"
