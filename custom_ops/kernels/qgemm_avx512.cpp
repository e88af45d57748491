// The integer-GEMM kernels of the avx512 table (see qgemm_impl.hpp; flags in CMakeLists.txt).
#define MLA_QGEMM_NS qgemm_avx512
#define MLA_QGEMM_TABLE kQgemmIsa
#define MLA_QGEMM_NAME "avx512"
#include "qgemm_impl.hpp"
