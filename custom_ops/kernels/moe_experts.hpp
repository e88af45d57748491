// MlaMoeExperts: the routed experts of one DeepSeek MoE layer in one op, on integer weights.
//
//   out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = topk_ids[t, j]
//
// with gate_e / up_e the rows [0, I) / [I, 2I) of expert e's w13 and down_e its w2. Only the
// selected experts' weights are read. Weights stay in their stored codes (qgemm.hpp: int8 or
// packed int4, f32 scale and u8 zero point per group) and are dequantised in registers (in f32,
// when an expert has many tokens, a panel of its rows is dequantised once and reused by all of
// them; under the reduced precision every token runs on int8 activations, qmatmul.hpp). Each token's expert contributions are added in ascending expert order, as
// transformers' expert loop adds them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mla_tensor.hpp"
#include "compute.hpp"
#include "qgemm.hpp"  // the weight codes (weight_format.hpp)

namespace mla {

struct MoeInputs {
    TensorView x;             // [T, H] f32
    TensorView topk_ids;      // [T, k] i32/i64 in [0, E)
    TensorView topk_weights;  // [T, k] f32
    TensorView w13_q, w13_s, w13_zp;  // [E, 2I, H / per_byte] u8, [E, 2I, G13] f32, [E, 2I, G13] u8
    TensorView w2_q, w2_s, w2_zp;     // [E, H, I / per_byte] u8, [E, H, G2] f32, [E, H, G2] u8
    bool zero_points_checked = false;  // int4 zero points already known to be <= 15 (qmatmul.hpp)
    // Both projections' codes in the tile16 layout (qmatmul.hpp; the op's `layout` attribute), the
    // formats whose weight_format.hpp entry allows it; every other expert's matrix as exported.
    bool tile16 = false;
};

struct MoeShapes { int64_t tokens, hidden; };

// Code width of each projection (4 or 8): mixed int4/int8 exports may keep one of them in int8.
struct MoeBits { int64_t w13, w2; };

// Checks every input and attribute (naming the bad one) and returns the output shape [T, H].
MoeShapes moe_experts_shapes(const MoeInputs& in, MoeBits bits);

// The op's int4 zero-point inputs as (input index, name): what the runtimes scan once when the
// weights are constants (check_int4_zero_points) instead of on every call.
std::vector<std::pair<size_t, const char*>> int4_zero_point_inputs(MoeBits bits);


void moe_experts(const MoeInputs& in, MoeBits bits, const TensorView& out, const Threading& threading,
                 Compute compute = Compute::f32);

}  // namespace mla
