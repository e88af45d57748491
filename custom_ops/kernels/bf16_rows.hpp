// What the bf16 row engines share (attention_amx.cpp, attention_bf16.cpp, indexer_amx.cpp): a cache
// row's 32 values as bf16 in one zmm, 16 lanes rounded to bf16, a 16 x 16 transpose, exp on a zmm.
// Included only by translation units compiled with AVX-512 F/BW and AVX512-BF16.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "decode_rows.hpp"
#include "vec_exp.hpp"

namespace mla {
namespace {  // internal to each including unit: the units are built with different -m flags

// 16 f32 lanes rounded to bf16 (nearest even), as 16 words.
inline __m256i to_bf16(__m512 v) {
    const __m256bh h = _mm512_cvtneps_pbh(v);
    __m256i out;
    std::memcpy(&out, &h, sizeof out);
    return out;
}

// 32 values of a row from column c, as bf16 (round to nearest even) in one zmm.
inline __m512i load32_bf16(const void* row, DecodeRowKind kind, int64_t c) {
    __m512 lo, hi;
    switch (kind) {
        case DecodeRowKind::bf16:
            return _mm512_loadu_si512(static_cast<const uint16_t*>(row) + c);
        case DecodeRowKind::f16: {
            const uint16_t* h = static_cast<const uint16_t*>(row) + c;
            lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
            hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + 16)));
            break;
        }
        default:
            lo = _mm512_loadu_ps(static_cast<const float*>(row) + c);
            hi = _mm512_loadu_ps(static_cast<const float*>(row) + c + 16);
    }
    const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
    __m512i out;
    std::memcpy(&out, &v, sizeof out);
    return out;
}

// r[i] (row i of a 16 x 16 block) becomes column i.
inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
        u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // u[4q + k] holds, in each 128-bit lane L, column 4L + k of rows 4q..4q+3.
    for (int k = 0; k < 4; ++k) {
        const __m512 a0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), a1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
        const __m512 b0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
        const __m512 b1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
        r[k] = _mm512_shuffle_f32x4(a0, b0, 0x88);
        r[8 + k] = _mm512_shuffle_f32x4(a0, b0, 0xdd);
        r[4 + k] = _mm512_shuffle_f32x4(a1, b1, 0x88);
        r[12 + k] = _mm512_shuffle_f32x4(a1, b1, 0xdd);
    }
}

// exp(x) for x <= 0, the f32 kernels' (vec_exp.hpp) on one zmm.
typedef float bf16_rows_vf16 __attribute__((vector_size(64)));
typedef int32_t bf16_rows_vi16 __attribute__((vector_size(64)));
inline __m512 exp_neg(__m512 x) {
    return (__m512)exp_neg_lanes<bf16_rows_vf16, bf16_rows_vi16>((bf16_rows_vf16)x);
}

}  // namespace
}  // namespace mla
