// Scalar element conversions between the cache/activation dtypes and f32 (accumulation is
// always f32). bf16 is the top half of an f32; f16 is IEEE half, converted in software so the
// generic build needs no F16C.
#pragma once

#include <cstdint>
#include <cstring>

#include "mla_tensor.hpp"

namespace mla {

inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Round to nearest even, NaN kept NaN (same as ml_dtypes and OpenVINO's bfloat16).
inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities, NaN =
// S.1111.111, largest finite 448), as ml_dtypes.float8_e4m3fn.
float e4m3_to_f32(uint8_t b);
// Round to nearest even, like ml_dtypes' float32 -> float8_e4m3fn for |f| <= 448; larger
// magnitudes saturate to +-448 (the cache write scales rows so that they never exceed it).
// NaN gives the NaN code.
uint8_t f32_to_e4m3(float f);

// dst[i] = float(src[i]) for a float dtype src.
void to_f32(const void* src, DType dtype, float* dst, int64_t n);
// dst[i] = dtype(src[i]).
void from_f32(const float* src, DType dtype, void* dst, int64_t n);

inline int64_t dtype_size(DType t) {
    switch (t) {
        case DType::f32: case DType::i32: return 4;
        case DType::bf16: case DType::f16: return 2;
        case DType::i64: return 8;
        case DType::u8: return 1;
        default: return 0;
    }
}

}  // namespace mla
