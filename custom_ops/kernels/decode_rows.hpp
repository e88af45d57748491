// The element types a chunk of cache rows reaches the bf16 decode-row engines in
// (attention_amx.hpp, attention_bf16.hpp): f32, f16 or bf16 rows; other cache formats are widened
// to f32 rows first.
#pragma once

namespace mla {

enum class DecodeRowKind { f32, f16, bf16 };

}  // namespace mla
