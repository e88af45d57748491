// An op's `compute` attribute: how its products run. Shared by every op that has one
// (MlaMoeExperts, MlaQLinear, MlaPagedAttention, MlaIndexerTopK).
#pragma once

#include <string>

namespace mla {

// Exact f32, or bf16 (which the runtime asks for when it runs the graph in bf16): the integer
// GEMM on int8 activations with AVX2 or AVX-512 VNNI, as the plugin's own compressed
// FullyConnected does with its dynamic quantization and llama.cpp with its Q8 activations (f32 with
// the portable table and on AVX-512 CPUs without VNNI); attention's bf16 products.
enum class Compute { f32, bf16 };

// The attribute's one check for both runtimes' ops: exactly "f32" | "bf16", else mla::Error naming
// the op. An absent attribute is "f32": each runtime's wrapper passes that default itself, so a
// present but empty value ("") is refused like any other.
Compute compute_from_name(const char* op, const std::string& name);

}  // namespace mla
