// MlaMoeExperts: the routed experts of one DeepSeek MoE layer in one op, on integer weights.
//
//   out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = topk_ids[t, j]
//
// with gate_e / up_e the rows [0, I) / [I, 2I) of expert e's w13 and down_e its w2. Only the
// selected experts' weights are read. Weights stay in their stored codes (moe_isa.hpp: int8 or
// packed int4, f32 scale and u8 zero point per group) and are dequantised in registers (in f32,
// when an expert has many tokens, a panel of its rows is dequantised once and reused by all of
// them; under the reduced precision every token runs on int8 activations, qmatmul.hpp). Each token's expert contributions are added in ascending expert order, as
// transformers' expert loop adds them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mla_tensor.hpp"
#include "moe_isa.hpp"  // the weight codes (kFp8Bits, weight_bits_valid)

namespace mla {

struct MoeInputs {
    TensorView x;             // [T, H] f32
    TensorView topk_ids;      // [T, k] i32/i64 in [0, E)
    TensorView topk_weights;  // [T, k] f32
    TensorView w13_q, w13_s, w13_zp;  // [E, 2I, H / per_byte] u8, [E, 2I, G13] f32, [E, 2I, G13] u8
    TensorView w2_q, w2_s, w2_zp;     // [E, H, I / per_byte] u8, [E, H, G2] f32, [E, H, G2] u8
    bool zero_points_checked = false;  // int4 zero points already known to be <= 15 (qmatmul.hpp)
};

struct MoeShapes { int64_t tokens, hidden; };

// Code width of each projection (4 or 8): mixed int4/int8 exports may keep one of them in int8.
struct MoeBits { int64_t w13, w2; };

// Checks every input and attribute (naming the bad one) and returns the output shape [T, H].
MoeShapes moe_experts_shapes(const MoeInputs& in, MoeBits bits);

// The op's int4 zero-point inputs as (input index, name): what the runtimes scan once when the
// weights are constants (check_int4_zero_points) instead of on every call.
std::vector<std::pair<size_t, const char*>> int4_zero_point_inputs(MoeBits bits);

// How the products run: exact f32, or (bf16, which the runtime asks for when it runs the graph in
// bf16) on int8 activations with AVX2 or AVX-512 VNNI, as the plugin's own compressed
// FullyConnected does with its dynamic quantization and llama.cpp with its Q8 activations; f32 with
// the portable table and on AVX-512 CPUs without VNNI.
enum class MoeCompute { f32, bf16 };
// An op's `compute` attribute, the one check of it for both runtimes' ops (MlaMoeExperts,
// MlaQLinear, MlaPagedAttention, MlaIndexerTopK): exactly "f32" | "bf16", else mla::Error naming
// the op. An absent attribute is "f32": each runtime's wrapper passes that default itself, so a
// present but empty value ("") is refused like any other.
MoeCompute moe_compute_from_name(const char* op, const std::string& name);

void moe_experts(const MoeInputs& in, MoeBits bits, const TensorView& out, const Threading& threading,
                 MoeCompute compute = MoeCompute::f32);

// Which vector table the op runs ("avx512", "avx2" or "generic"; MLA_EXPORT_ISA forces one).
const char* moe_isa_name();

}  // namespace mla
