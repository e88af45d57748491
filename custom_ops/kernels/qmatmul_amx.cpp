// AMX-INT8 tiles for the integer ops' products of 8 rows and more (see qmatmul_amx.hpp). Compiled with
// -mamx-tile -mamx-int8 -mavx512f/bw/vl/dq (CMakeLists.txt); entered only when kernels().amx_int8
// says the CPU and the OS allow it (amx.hpp).
#include "qmatmul_amx.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "aligned_vector.hpp"
#include "amx.hpp"

namespace mla {
namespace {

// Tiles 0-1 (the sums of the first token tile) and 4 (its activations) hold n0 token rows; tiles
// 2-3 and 5 the second token tile's n1 (0: unconfigured, not touched); 6-7 the weights (16 rows).
// Token tiles of fewer than 16 rows (decode's batches) then neither load nor multiply padding.
TileConfig token_config(int n0, int n1) {
    TileConfig cfg;
    for (int t : {0, 1, 4}) cfg.rows[t] = static_cast<uint8_t>(n0);
    for (int t : {2, 3, 5}) cfg.rows[t] = static_cast<uint8_t>(n1), cfg.colsb[t] = n1 > 0 ? 64 : 0;
    return cfg;
}
constexpr int64_t kStep = 64;  // inputs per tile product
// Bytes ahead in a 4-row block's codes (2 steps). 512 against 1 KB, the 3-layer V2-Lite int8 b8
// step (5 alternated pairs, medians): lm_head 8.89 -> 8.82 ms, the 10944 x 2048 projections 1.06 ->
// 0.98 ms, the step 46.2 -> 45.3 ms; a C++ harness on the 8-row lm_head, 256-512 B 7.9-8.3 ms,
// 768 B-1 KB 8.2-8.5, 2-4 KB into L2 (T1) 8.8-9.6.
constexpr int64_t kPackPrefetch = 512;
// Bytes ahead in each of a tile16 call's two 16-row streams (a step reads 1 KB of each). On the
// 102400 x 2048 int8 lm_head at 8 rows (Xeon, 2 cores, alternated with the 4-row layout's re-laid
// tiles, medians of 15): none 0.94x the 4-row time, 512 B 1.04x, 1 KB 1.09x, 2-3 KB 1.08-1.10x, 4 KB
// 1.07x.
constexpr int64_t kTile16Prefetch = 2048;

struct Scratch {
    LineVector<uint8_t> w;       // the tile's weights in B layout: [K / 64][2 row halves][16][64]
    LineVector<int8_t> a[2];     // gathered activation rows of a token tile: [n <= 16][K]
    std::vector<float> sv, szp;  // per group: the 32 rows' scales, and scale x zero point
    std::vector<float> d;        // per token of the pair and activation block: its d
};
thread_local Scratch tls;

// Four 64-byte lines of a 4-row block each (the rows' codes at 16 consecutive inputs, as u8
// values) -> four B rows: out[q] dword n = line[n / 4] dword (n % 4) * 4 + q, i.e. inputs 4q..4q+3
// of the 16 rows.
inline void transpose_lines(const __m512i line[4], __m512i out[4]) {
    // Dword n of the pair (a, b) that vpermt2d picks for quad 0: (n % 8) / 4 selects a or b.
    const __m512i quad0 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    for (int q = 0; q < 4; ++q) {
        const __m512i ix = _mm512_add_epi32(quad0, _mm512_set1_epi32(q));
        const __m512i lo = _mm512_permutex2var_epi32(line[0], ix, line[1]);  // rows 0-7 in dwords 0-7
        const __m512i hi = _mm512_permutex2var_epi32(line[2], ix, line[3]);  // rows 8-15 in dwords 8-15
        out[q] = _mm512_mask_blend_epi32(0xFF00, lo, hi);
    }
}

// Step s (inputs 64s .. 64s + 63) of the 32 weight rows of `blocks` as two B tiles at dst (tile h
// at h * 16 * 64): row kq of tile h holds in dword n the codes of weight row 16h + n at inputs
// 64s + 4kq .. +3.
inline __attribute__((always_inline)) void pack_step(int bits_index, const QBlock* blocks, int64_t s, uint8_t* dst) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    for (int64_t h = 0; h < 2; ++h) {
        const QBlock* blk = blocks + 4 * h;
        uint8_t* tile = dst + h * 16 * 64;
        if (bits_index == 0) {  // int8: chunk c holds inputs 16c..16c+15 of each of a block's 4 rows
            for (int64_t c = 4 * s; c < 4 * s + 4; ++c) {
                __m512i line[4], out[4];
                for (int b = 0; b < 4; ++b) {
                    // kPackPrefetch ahead in each block's run: the reads then keep going while this
                    // step's re-layout and products run (b8 step 51.8-52.6 -> 47.8-50.4 ms at 1 KB)
                    _mm_prefetch(reinterpret_cast<const char*>(blk[b].q + c * 64 + kPackPrefetch), _MM_HINT_T0);
                    line[b] = _mm512_loadu_si512(blk[b].q + c * 64);
                }
                transpose_lines(line, out);
                const int64_t kq = (c - 4 * s) * 4;
                for (int q = 0; q < 4; ++q) _mm512_storeu_si512(tile + (kq + q) * 64, out[q]);
            }
        } else {  // int4: chunk c holds inputs 32c+j (low nibble) and 32c+16+j (high nibble)
            for (int64_t c = 2 * s; c < 2 * s + 2; ++c) {
                __m512i lo[4], hi[4], out[4];
                for (int b = 0; b < 4; ++b) {
                    const __m512i v = _mm512_loadu_si512(blk[b].q + c * 64);
                    lo[b] = _mm512_and_si512(v, nibble);
                    hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
                }
                for (int half = 0; half < 2; ++half) {
                    transpose_lines(half == 0 ? lo : hi, out);
                    const int64_t kq = ((c - 2 * s) * 32 + 16 * half) / 4;
                    for (int q = 0; q < 4; ++q) _mm512_storeu_si512(tile + (kq + q) * 64, out[q]);
                }
            }
        }
    }
}

// The activation rows of one token tile (tokens t0 .. t0 + n, n <= 16) as an A operand of n rows:
// where they are consecutive rows of acts, as they lie; else copied into buf.
const int8_t* token_tile(const QActs& acts, const int64_t* rows, int64_t t0, int64_t n, int64_t K,
                         LineVector<int8_t>& buf) {
    bool consecutive = true;
    for (int64_t t = 1; consecutive && t < n; ++t) consecutive = rows[t0 + t] == rows[t0] + t;
    if (consecutive) return acts.q8(rows[t0]).q;
    buf.resize(n * K);
    for (int64_t t = 0; t < n; ++t) std::memcpy(buf.data() + t * K, acts.q8(rows[t0 + t]).q, K);
    return buf.data();
}

// The weights of a call's 32 rows as B tiles, step by step (a step = 64 inputs: two B tiles of 16
// rows). Rows4B re-lays the 4-row layout's codes into scratch: the call's first token pair re-lays
// each NEXT step while the current one multiplies (step 0 before the first block), so the codes'
// reads overlap tile work and a step's B tiles are not loaded right behind the stores that wrote
// them (re-laid all at once before the products, reads and products took turns: the 102400 x 2048
// int8 lm_head at 16 rows ran 15-19 ms against 13.3-14.9 ms this way, 2 cores, alternated runs).
struct Rows4B {
    int bits_index;
    const QBlock* blocks;
    int64_t K;
    uint8_t* w;  // [K / 64][2 row halves][16][64]
    static constexpr int64_t kSpan = 2 * 16 * 64;
    float scale(int64_t row, int64_t g) const { return blocks[row / 4].s[row % 4][g]; }
    uint8_t zero_point(int64_t row, int64_t g) const { return blocks[row / 4].zp[row % 4][g]; }
    void begin() const { pack_step(bits_index, blocks, 0, w); }
    // B tile h of the step at input k; `first`: this token pair is the call's first (it re-lays).
    const uint8_t* tile(int h, int64_t k, bool first) const {
        uint8_t* wb = w + (k / kStep) * kSpan;
        if (h == 0 && first && k + kStep < K) pack_step(bits_index, blocks, k / kStep + 1, wb + kSpan);
        return wb + h * 16 * 64;
    }
};

// tile16 codes (qmatmul.hpp) ARE B tiles: the 16 lines of inputs k..k+63 of a 16-row tile (64 bytes
// each, 4 inputs of the 16 rows, a row per dword) lie consecutively at 16 * k from the tile's start,
// so tdpbsud loads them where they are: no re-layout, no scratch, two plain 1 KB streams.
struct Tile16B {
    const uint8_t* q;
    const float* s;
    const uint8_t* zp;
    int64_t groups, K;
    float scale(int64_t row, int64_t g) const { return s[tile16_factor(row, g, groups)]; }
    uint8_t zero_point(int64_t row, int64_t g) const { return zp[tile16_factor(row, g, groups)]; }
    void begin() const {}
    const uint8_t* tile(int h, int64_t k, bool first) const {
        const uint8_t* t = q + h * 16 * K + 16 * k;
        if (first)
            for (int64_t line = 0; line < 16 * 64; line += 64)
                _mm_prefetch(reinterpret_cast<const char*>(t + kTile16Prefetch + line), _MM_HINT_T0);
        return t;
    }
};

// One activation block's tile products (inputs k_begin .. k_end) into tiles 0-1 (and 2-3 for a
// second token tile, TWO).
template <bool TWO, class B>
void block_products(const B& wsrc, int64_t k_begin, int64_t k_end, bool first, const int8_t* a0, const int8_t* a1,
                    int kstride) {
    _tile_zero(0);
    _tile_zero(1);
    if (TWO) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t k = k_begin; k < k_end; k += kStep) {
        const uint8_t* b0 = wsrc.tile(0, k, first);
        const uint8_t* b1 = wsrc.tile(1, k, first);
        _tile_loadd(4, a0 + k, kstride);
        _tile_loadd(6, b0, 64);
        _tile_loadd(7, b1, 64);
        _tile_dpbsud(0, 4, 6);
        _tile_dpbsud(1, 4, 7);
        if (TWO) {
            _tile_loadd(5, a1 + k, kstride);
            _tile_dpbsud(2, 5, 6);
            _tile_dpbsud(3, 5, 7);
        }
    }
}

template <class B>
void products(const B& wsrc, const QActs& acts, const int64_t* rows, int64_t m, int64_t K, int64_t group, float* c) {
    Scratch& sc = tls;
    const int64_t groups = K / group, block = q8_block(group), blocks_k = K / block;
    // Per group, the 32 rows' scales and scale x zero point.
    sc.sv.resize(groups * kTileRows);
    sc.szp.resize(groups * kTileRows);
    for (int64_t row = 0; row < kTileRows; ++row)
        for (int64_t g = 0; g < groups; ++g) {
            const float s = wsrc.scale(row, g);
            sc.sv[g * kTileRows + row] = s;
            sc.szp[g * kTileRows + row] = s * static_cast<float>(wsrc.zero_point(row, g));
        }
    const int kstride = static_cast<int>(K);
    // Block sums leave the tiles through ct, double-buffered: block bk - 1's sums are folded while
    // block bk's tile products run (the fold is vector work as long as the products themselves).
    alignas(64) int32_t ct[2][4][16 * 16];
    for (int64_t t0 = 0; t0 < m; t0 += 32) {  // two token tiles at a time: 4 accumulator tiles
        const int64_t n0 = std::min<int64_t>(16, m - t0), n1 = std::clamp<int64_t>(m - t0 - 16, 0, 16);
        const int8_t* a0 = token_tile(acts, rows, t0, n0, K, sc.a[0]);
        const int8_t* a1 = n1 > 0 ? token_tile(acts, rows, t0 + 16, n1, K, sc.a[1]) : nullptr;
        const TileConfig cfg = token_config(static_cast<int>(n0), static_cast<int>(n1));
        _tile_loadconfig(&cfg);
        const int64_t nt = n0 + n1;
        sc.d.resize(nt * blocks_k);
        for (int64_t t = 0; t < nt; ++t) std::memcpy(&sc.d[t * blocks_k], acts.q8(rows[t0 + t]).d, blocks_k * sizeof(float));
        __m512 acc[32][2];
        for (int64_t t = 0; t < 32; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
        // acc[t][h] += block bk's sums x (d of token t's block bk) x (the rows' scales of its group).
        const auto fold = [&](int64_t bk, const int32_t (*sums)[16 * 16]) {
            const int64_t g = bk * block / group;
            const __m512 s0 = _mm512_loadu_ps(&sc.sv[g * kTileRows]), s1 = _mm512_loadu_ps(&sc.sv[g * kTileRows + 16]);
            for (int64_t t = 0; t < nt; ++t) {
                const int tile = t < 16 ? 0 : 2, r = static_cast<int>(t % 16);
                const __m512 d = _mm512_set1_ps(sc.d[t * blocks_k + bk]);
                acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[tile] + 16 * r)),
                                            _mm512_mul_ps(s0, d), acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[tile + 1] + 16 * r)),
                                            _mm512_mul_ps(s1, d), acc[t][1]);
            }
        };
        if (t0 == 0) wsrc.begin();
        for (int64_t bk = 0; bk < blocks_k; ++bk) {
            if (a1 != nullptr)
                block_products<true>(wsrc, bk * block, (bk + 1) * block, t0 == 0, a0, a1, kstride);
            else
                block_products<false>(wsrc, bk * block, (bk + 1) * block, t0 == 0, a0, a1, kstride);
            if (bk > 0) fold(bk - 1, ct[(bk - 1) & 1]);
            int32_t(*out)[16 * 16] = ct[bk & 1];
            _tile_stored(0, out[0], 64);
            _tile_stored(1, out[1], 64);
            if (a1 != nullptr) {
                _tile_stored(2, out[2], 64);
                _tile_stored(3, out[3], 64);
            }
        }
        fold(blocks_k - 1, ct[(blocks_k - 1) & 1]);
        // Less the zero points' term, sum over groups of scale x zero point x gsum, and out.
        for (int64_t t = 0; t < nt; ++t) {
            const float* gsum = acts.q8(rows[t0 + t]).gsum;
            __m512 z0 = _mm512_setzero_ps(), z1 = _mm512_setzero_ps();
            for (int64_t g = 0; g < groups; ++g) {
                const __m512 gs = _mm512_set1_ps(gsum[g]);
                z0 = _mm512_fmadd_ps(_mm512_loadu_ps(&sc.szp[g * kTileRows]), gs, z0);
                z1 = _mm512_fmadd_ps(_mm512_loadu_ps(&sc.szp[g * kTileRows + 16]), gs, z1);
            }
            _mm512_storeu_ps(c + (t0 + t) * kTileRows, _mm512_sub_ps(acc[t][0], z0));
            _mm512_storeu_ps(c + (t0 + t) * kTileRows + 16, _mm512_sub_ps(acc[t][1], z1));
        }
    }
    _tile_release();
}

}  // namespace

void qtile_amx(int bits_index, const QActs& acts, const int64_t* rows, int64_t m, const QBlock* blocks, int64_t K,
               int64_t group, float* c) {
    tls.w.resize(K / kStep * Rows4B::kSpan);
    products(Rows4B{bits_index, blocks, K, tls.w.data()}, acts, rows, m, K, group, c);
}

void qtile16_amx(const QActs& acts, const int64_t* rows, int64_t m, const uint8_t* q, const float* s,
                 const uint8_t* zp, int64_t groups, int64_t K, int64_t group, float* c) {
    products(Tile16B{q, s, zp, groups, K}, acts, rows, m, K, group, c);
}

}  // namespace mla
