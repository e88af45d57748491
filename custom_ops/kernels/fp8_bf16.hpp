// e4m3 codes -> bf16 in registers, shared by the fp8 bf16 dots (qgemm_impl.hpp) and the fp8
// AMX-BF16 tiles (qmatmul_fp8_amx.cpp). Include only where AVX-512F/BW is compiled in.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace mla {

// A row's 32 codes (16 at lo, inputs k..k+15; 16 at hi, k+16..k+31) as 32 bf16: u = code << 4 puts
// the mantissa at bits 4..6, the exponent at 7..10 and the sign at 11; (u & 0x7F0) + (120 << 7)
// rebiases the exponent (7 -> 127), zeroed for exponent 0 (the subnormal codes and 0: the bf16
// products flush denormals anyway); the sign moves to bit 15 through one bit select. Exact for
// every normal code and zero.
inline __m512i e4m3_to_bf16x32(const uint8_t* lo, const uint8_t* hi) {
    const __m256i raw = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
    const __m512i c = _mm512_cvtepu8_epi16(raw);
    const __m512i u = _mm512_slli_epi16(c, 4);
    const __m512i v = _mm512_maskz_add_epi16(_mm512_test_epi16_mask(c, _mm512_set1_epi16(0x78)),
                                             _mm512_and_si512(u, _mm512_set1_epi16(0x7F0)), _mm512_set1_epi16(120 << 7));
    return _mm512_ternarylogic_epi32(_mm512_set1_epi16(static_cast<short>(0x8000)), _mm512_slli_epi16(u, 4), v, 0xCA);
}

}  // namespace mla
