#define MLA_ISA_NS generic
#define MLA_ISA_NAME "generic"
#include "isa_impl.hpp"

namespace mla {
const IsaKernels& isa_generic() { return generic::table; }
}  // namespace mla
