// The vectorised pieces of the fused MoE op (moe_experts.cpp), compiled once per instruction set
// from moe_isa_impl.hpp (moe_isa_avx512.cpp, moe_isa_avx2.cpp, moe_isa_generic.cpp); one table is
// picked at run time for the CPU at hand.
//
// Weights are rows of integer codes with a scale and a zero point per group of `group` inputs:
// w[k] = (q[k] - zp[k / group]) * s[k / group]. int8 rows hold one code per byte; int4 rows hold
// two per byte in blocks of 32 inputs: byte j of a block carries input j in its low nibble and
// input j + 16 in its high nibble, so one 16-byte load unpacks to two 16-lane vectors.
#pragma once

#include <cstdint>

namespace mla {

// One weight row: codes, and its per-group scales and zero points.
struct QRow {
    const uint8_t* q;
    const float* s;
    const uint8_t* zp;
};

struct MoeIsa {
    const char* name;
    // out[t * ldo + r] = sum_k x[t][k] * w_r[k] for 4 rows r and M = 1..4 rows t (index M - 1),
    // dequantising in registers; xsum[t][g] = sum of x[t] over group g (for the zero points).
    // bits index 0 = int8, 1 = int4. pf: byte offset from each row's codes to prefetch alongside
    // (the rows of the next call; rows are too short for the hardware prefetcher to ramp up).
    void (*qdot[2][4])(int64_t K, int64_t group, const float* const* x, const float* const* xsum,
                       const QRow* rows, float* out, int64_t ldo, int64_t pf);
    // dst[r * kb + p] = w_r[k0 + p] for n rows r and p < kb (k0, kb multiples of 32).
    void (*dequant[2])(int64_t n, const QRow* rows, int64_t k0, int64_t kb, int64_t group, float* dst);
    // out[t * ldo + r] += sum_p a[t][k0 + p] * w[r * kb + p] for 4 rows r and M = 1..4 rows t.
    void (*fdot[4])(int64_t k0, int64_t kb, const float* const* a, const float* w, float* out, int64_t ldo);
};

const MoeIsa& moe_isa();

}  // namespace mla
