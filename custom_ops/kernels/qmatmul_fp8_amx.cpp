// fp8 (e4m3) codes on AMX-BF16 tiles: the reduced precision's products of 8 rows of x and more for
// weights in fp8 codes (see qmatmul_amx.hpp). Compiled with -mamx-tile -mamx-bf16
// -mavx512f/bw/vl/dq/bf16 (CMakeLists.txt); entered only when kernels().amx_bf16.
//
// A tiles are the activation rows in bf16 as they lie (16 tokens x 32 inputs), B tiles the weights:
// each step of 32 inputs, a half of the tile's 32 rows decoded to bf16 (as qdot_fp8_bf16 decodes them:
// exact for normal codes and zero, the subnormal codes as 0, which tdpbf16ps would flush anyway)
// and transposed into 16 pair rows (row kp, dword n = weight row n's inputs 2kp, 2kp + 1). The
// whole tile's B operand is made once per call, before the products, and serves every token tile;
// sums leave the C tiles once per weight group to be scaled by the rows' group scales.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "aligned_vector.hpp"
#include "amx.hpp"
#include "fp8_bf16.hpp"
#include "qmatmul_amx.hpp"

namespace mla {
namespace {

constexpr int64_t kStep = 32;                  // inputs per tile product (16 bf16 pairs)
constexpr int64_t kHalfStep = 16 * kStep;      // bf16 values of one B tile (16 pair rows x 32)

struct Scratch {
    LineVector<uint16_t> w;     // [K / 32][2 row halves][16 pair rows][32 bf16]
    LineVector<uint16_t> a[2];  // gathered activation rows of a token tile, when not consecutive
    std::vector<float> sv;      // [groups][32 rows] scales
};
thread_local Scratch tls;

// Tiles 0-1 (sums of the first token tile) and 4 (its activations) hold n0 token rows; 2-3 and 5
// the second token tile's n1 (0: unconfigured); 6-7 the weights' two halves.
TileConfig token_config(int n0, int n1) {
    TileConfig cfg;
    for (int t : {0, 1, 4}) cfg.rows[t] = static_cast<uint8_t>(n0);
    for (int t : {2, 3, 5}) cfg.rows[t] = static_cast<uint8_t>(n1), cfg.colsb[t] = n1 > 0 ? 64 : 0;
    return cfg;
}

// r[n] dword j -> r[j] dword n (16 x 16 dwords).
inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // r[4B + q], 128-bit lane L: column 4L + q of rows 4B..4B+3; a 4 x 4 transpose of lanes remains
    for (int i = 0; i < 16; ++i) t[i] = r[i];
    for (int q = 0; q < 4; ++q) {
        const __m512i a = _mm512_shuffle_i32x4(t[q], t[4 + q], 0x44);       // lanes 0,1 of rows 0-3 | 4-7
        const __m512i b = _mm512_shuffle_i32x4(t[q], t[4 + q], 0xEE);       // lanes 2,3
        const __m512i c = _mm512_shuffle_i32x4(t[8 + q], t[12 + q], 0x44);  // lanes 0,1 of rows 8-11 | 12-15
        const __m512i d = _mm512_shuffle_i32x4(t[8 + q], t[12 + q], 0xEE);
        r[q] = _mm512_shuffle_i32x4(a, c, 0x88);       // lane 0 of each: columns 0..3 -> j = q
        r[4 + q] = _mm512_shuffle_i32x4(a, c, 0xDD);   // lane 1: columns 4..7
        r[8 + q] = _mm512_shuffle_i32x4(b, d, 0x88);   // lane 2
        r[12 + q] = _mm512_shuffle_i32x4(b, d, 0xDD);  // lane 3
    }
}

// Every step's B tiles of the 32 rows of `blocks` (4-row interleaved fp8 codes) into w.
void pack_weights(const QBlock* blocks, int64_t K, uint16_t* w) {
    for (int64_t k = 0; k < K; k += kStep) {
        for (int h = 0; h < 2; ++h) {
            __m512i r[16];
            for (int n = 0; n < 16; ++n) {
                const QBlock& b = blocks[4 * h + n / 4];
                const uint8_t* line = b.q + (k / 16) * 64 + 16 * (n % 4);
                r[n] = e4m3_to_bf16x32(line, line + 64);
            }
            transpose16(r);
            uint16_t* dst = w + ((k / kStep) * 2 + h) * kHalfStep;
            for (int kp = 0; kp < 16; ++kp) _mm512_store_si512(dst + kp * 32, r[kp]);
        }
    }
}

const uint16_t* token_tile(const QActs& acts, const int64_t* rows, int64_t t0, int64_t n, int64_t K,
                           LineVector<uint16_t>& buf) {
    bool consecutive = true;
    for (int64_t t = 1; consecutive && t < n; ++t) consecutive = rows[t0 + t] == rows[t0] + t;
    if (consecutive) return acts.bf16(rows[t0]);
    buf.resize(n * K);
    for (int64_t t = 0; t < n; ++t) std::memcpy(buf.data() + t * K, acts.bf16(rows[t0 + t]), K * sizeof(uint16_t));
    return buf.data();
}

}  // namespace

void qtile_fp8_amx(const QActs& acts, const int64_t* rows, int64_t m, const QBlock* blocks, int64_t K, int64_t group,
                   float* c) {
    Scratch& sc = tls;
    sc.w.resize(K / kStep * 2 * kHalfStep);
    pack_weights(blocks, K, sc.w.data());
    const int64_t groups = K / group;
    sc.sv.resize(groups * kTileRows);
    for (int64_t row = 0; row < kTileRows; ++row)
        for (int64_t g = 0; g < groups; ++g) sc.sv[g * kTileRows + row] = blocks[row / 4].s[row % 4][g];
    const int stride = static_cast<int>(K * sizeof(uint16_t));
    alignas(64) float ct[4][16 * 16];
    for (int64_t t0 = 0; t0 < m; t0 += 32) {  // two token tiles at a time: 4 accumulator tiles
        const int64_t n0 = std::min<int64_t>(16, m - t0), n1 = std::clamp<int64_t>(m - t0 - 16, 0, 16);
        const uint16_t* a0 = token_tile(acts, rows, t0, n0, K, sc.a[0]);
        const uint16_t* a1 = n1 > 0 ? token_tile(acts, rows, t0 + 16, n1, K, sc.a[1]) : nullptr;
        const TileConfig cfg = token_config(static_cast<int>(n0), static_cast<int>(n1));
        _tile_loadconfig(&cfg);
        __m512 acc[32][2];
        for (int64_t t = 0; t < 32; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
        for (int64_t g = 0; g < groups; ++g) {
            _tile_zero(0);
            _tile_zero(1);
            if (a1 != nullptr) {
                _tile_zero(2);
                _tile_zero(3);
            }
            for (int64_t k = g * group; k < (g + 1) * group; k += kStep) {
                const uint16_t* b = sc.w.data() + (k / kStep) * 2 * kHalfStep;
                _tile_loadd(4, a0 + k, stride);
                _tile_loadd(6, b, 64);
                _tile_loadd(7, b + kHalfStep, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                if (a1 != nullptr) {
                    _tile_loadd(5, a1 + k, stride);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, ct[0], 64);
            _tile_stored(1, ct[1], 64);
            if (a1 != nullptr) {
                _tile_stored(2, ct[2], 64);
                _tile_stored(3, ct[3], 64);
            }
            const __m512 s0 = _mm512_loadu_ps(&sc.sv[g * kTileRows]), s1 = _mm512_loadu_ps(&sc.sv[g * kTileRows + 16]);
            for (int64_t t = 0; t < n0 + n1; ++t) {
                const int tile = t < 16 ? 0 : 2, r = static_cast<int>(t % 16);
                acc[t][0] = _mm512_fmadd_ps(_mm512_load_ps(ct[tile] + 16 * r), s0, acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(_mm512_load_ps(ct[tile + 1] + 16 * r), s1, acc[t][1]);
            }
        }
        for (int64_t t = 0; t < n0 + n1; ++t) {
            _mm512_storeu_ps(c + (t0 + t) * kTileRows, acc[t][0]);
            _mm512_storeu_ps(c + (t0 + t) * kTileRows + 16, acc[t][1]);
        }
    }
    _tile_release();
}

}  // namespace mla
