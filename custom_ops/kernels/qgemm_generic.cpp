// The integer-GEMM kernels of the generic table (see qgemm_impl.hpp; flags in CMakeLists.txt).
#define MLA_QGEMM_NS qgemm_generic
#define MLA_QGEMM_TABLE kQgemmIsa
#define MLA_QGEMM_NAME "generic"
#include "qgemm_impl.hpp"
