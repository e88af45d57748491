// The integer-GEMM kernels of the avx2 table (see qgemm_impl.hpp; flags in CMakeLists.txt).
#define MLA_QGEMM_NS qgemm_avx2
#define MLA_QGEMM_TABLE kQgemmIsa
#define MLA_QGEMM_NAME "avx2"
#include "qgemm_impl.hpp"
