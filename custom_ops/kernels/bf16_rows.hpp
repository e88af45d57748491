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

// 16 f32 lanes -> 16 bf16 values zero-extended into 16 dwords (the low half of each).
inline __m512i bf16_dwords(__m512 v) { return _mm512_cvtepu16_epi32(to_bf16(v)); }

// vdpbf16ps on integer vectors holding bf16 pairs: acc + a.lo * b.lo + a.hi * b.hi in each lane.
inline __m512bh as_bh(__m512i v) {
    __m512bh b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}
inline __m512 dp(__m512 acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, as_bh(a), as_bh(b)); }
// One bf16 pair (a dword) broadcast to every lane.
inline __m512i bcast_dword(const uint32_t* p) { return _mm512_set1_epi32(static_cast<int32_t>(*p)); }

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

// Q^T as AMX B tiles (attention_amx.hpp explains the layout): tile (g, s) row p holds, for query
// row 16g + j, the bf16 pair of inputs 32s + 2p and 32s + 2p + 1 in its dword j (rows past m zero:
// they score 0 and are dropped). A 16 x 16 dword transpose of the rows' bf16 pairs per tile.
// q [m, w] f32 rows, w % 32 == 0; out holds ceil(m / 16) * (w / 32) tiles of 512 words.
inline void pack_qt_tiles(const float* q, int64_t m, int64_t w, uint16_t* out) {
    const int64_t groups = (m + 15) / 16, ks = w / 32;
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t s = 0; s < ks; ++s) {
            __m512 pairs[16];
            for (int64_t j = 0; j < 16; ++j) {
                const int64_t i = 16 * g + j;
                if (i >= m) {
                    pairs[j] = _mm512_setzero_ps();
                    continue;
                }
                const float* src = q + i * w + 32 * s;
                const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));
                std::memcpy(&pairs[j], &h, sizeof h);
            }
            transpose16(pairs);
            uint16_t* tile = out + (g * ks + s) * 512;
            for (int p = 0; p < 16; ++p) _mm512_storeu_ps(tile + 32 * p, pairs[p]);
        }
}

// Where the A tiles of each 16-row group of a chunk of n (<= 64) cache rows of w values read their
// rows: bf16 rows that lie 16 in a row in one cache block are read where they live (no copy: a
// paged cache's blocks are row-major, so a block of 16 rows is a tile's rows at the row stride);
// any other group (f32 or f16 rows, rows split across blocks, the chunk's partial last group) is
// converted into kb [64, w] as bf16 rows, rows past n zero (a zero weight meeting whatever the
// cache holds there would still give 0 x NaN = NaN). Returns the number of groups.
inline int64_t place_row_groups(const void* const* rows, DecodeRowKind kind, int64_t n, int64_t w, uint16_t* kb_all,
                                const uint16_t* base[4], int64_t stride[4]) {
    const int64_t ng = (n + 15) / 16;
    const int64_t row_bytes = w * (kind == DecodeRowKind::f32 ? 4 : 2);
    for (int64_t g = 0; g < ng; ++g) {
        const int64_t j0 = 16 * g, valid = n - j0 < 16 ? n - j0 : 16;
        bool direct = kind == DecodeRowKind::bf16 && valid == 16;
        for (int64_t j = 1; direct && j < 16; ++j)
            direct = static_cast<const char*>(rows[j0 + j]) == static_cast<const char*>(rows[j0]) + j * row_bytes;
        if (direct) {
            base[g] = static_cast<const uint16_t*>(rows[j0]);
            stride[g] = row_bytes;
            continue;
        }
        uint16_t* kb = kb_all + j0 * w;
        for (int64_t j = 0; j < valid; ++j)
            for (int64_t c = 0; c < w; c += 32) _mm512_storeu_si512(kb + j * w + c, load32_bf16(rows[j0 + j], kind, c));
        std::memset(kb + valid * w, 0, (16 - valid) * w * sizeof(uint16_t));
        base[g] = kb;
        stride[g] = w * 2;
    }
    return ng;
}

// exp(x) for x <= 0, the f32 kernels' (vec_exp.hpp) on one zmm.
typedef float bf16_rows_vf16 __attribute__((vector_size(64)));
typedef int32_t bf16_rows_vi16 __attribute__((vector_size(64)));
inline __m512 exp_neg(__m512 x) {
    return (__m512)exp_neg_lanes<bf16_rows_vf16, bf16_rows_vi16>((bf16_rows_vf16)x);
}

}  // namespace
}  // namespace mla
