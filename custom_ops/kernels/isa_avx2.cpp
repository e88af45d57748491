// Compiled with -mavx2 -mfma -mf16c (see CMakeLists.txt); only called when the CPU has them.
#define MLA_ISA_NS avx2
#define MLA_ISA_NAME "avx2"
#include "isa_impl.hpp"

namespace mla {
const IsaKernels* isa_avx2() { return &avx2::table; }
}  // namespace mla
