// exp(x) for x <= 0 in GCC/Clang vector extensions, for any lane count: the softmax's exponent
// after subtracting the running max, written once for the f32 kernels (isa_impl.hpp) and the AMX
// decode attention (attention_amx.cpp).
#pragma once

#include <cstring>

namespace mla {

// 2^(x log2 e) split into an integer power (built in the exponent bits) and a degree-6 polynomial
// on [-0.5, 0.5]; relative error ~2e-7. -inf and very negative inputs give 0. VF: float lanes, VI:
// int32 lanes of the same count.
template <typename VF, typename VI>
static inline VF exp_neg_lanes(VF x) {
    const VF lo = VF{} + -87.3f;
    x = x < lo ? lo : x;  // vector compare+select; keeps 2^n representable
    const VF t = x * 1.44269504088896341f;
    // Round to nearest with the 1.5 * 2^23 trick (|t| < 2^22 here), branch-free and vectorised.
    const VF n = (t + 12582912.0f) - 12582912.0f;
    const VF f = t - n;  // in [-0.5, 0.5]
    VF p = VF{} + 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    const VI e = (__builtin_convertvector(n, VI) + 127) << 23;
    VF scale;
    std::memcpy(&scale, &e, sizeof(scale));
    const VF r = p * scale;
    return x <= lo ? VF{} : r;
}

}  // namespace mla
