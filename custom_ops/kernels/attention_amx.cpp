// AMX bf16 tiles for the absorbed decode rows (see attention_amx.hpp). Compiled with
// -mamx-tile -mamx-bf16 -mavx512f/bw/vl/dq -mavx512bf16 (CMakeLists.txt); entered only when
// amx_bf16_usable() says the CPU and the OS allow it (amx.hpp).
#include "attention_amx.hpp"

#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <limits>

#include "amx.hpp"
#include "numeric.hpp"
#include "vec_exp.hpp"

namespace mla {
namespace {

constexpr int64_t kRows = 64;  // cache rows per chunk: four 16-row tiles

const TileConfig kConfig;

inline __m256i to_bf16(__m512 v) {
    const __m256bh h = _mm512_cvtneps_pbh(v);
    __m256i out;
    std::memcpy(&out, &h, sizeof out);
    return out;
}

// exp(x) for x <= 0, the f32 kernels' (vec_exp.hpp) on one zmm.
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
inline __m512 exp_neg(__m512 x) { return (__m512)exp_neg_lanes<vf16, vi16>((vf16)x); }

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

}  // namespace

void AmxDecodeRows::begin(const float* q, int64_t m, int64_t w, int64_t r) {
    m_ = m, w_ = w, r_ = r, groups_ = (m + 15) / 16;
    const int64_t ks = w / 32;
    // Q^T as B tiles: tile (g, s) row p holds, for query row 16g + j, the bf16 pair of inputs
    // 32s + 2p and 32s + 2p + 1 in its dword j (rows past m zero: they score 0 and are dropped).
    qt_.assign(groups_ * ks * 512, 0);
    for (int64_t i = 0; i < m; ++i) {
        const int64_t g = i / 16, j = i % 16;
        for (int64_t d = 0; d < w; ++d)
            qt_[((g * ks + d / 32) * 16 + (d % 32) / 2) * 32 + j * 2 + d % 2] = f32_to_bf16(q[i * w + d]);
    }
    kb_.resize(kRows * w);
    vp_.resize(kRows * r);
    pr_.resize(16 * kRows);
    st_.resize(kRows * 16);
    ot_.assign(groups_ * 16 * r, 0.f);
    mx_.assign(groups_ * 16, -std::numeric_limits<float>::infinity());
    l_.assign(groups_ * 16, 0.f);
    _tile_loadconfig(&kConfig);
}

// 32 values of a row from column c, as bf16 in one zmm.
static inline __m512i load32(const void* row, AmxDecodeRows::Rows kind, int64_t c) {
    __m512 lo, hi;
    switch (kind) {
        case AmxDecodeRows::Rows::bf16:
            return _mm512_loadu_si512(static_cast<const uint16_t*>(row) + c);
        case AmxDecodeRows::Rows::f16: {
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

// The chunk's rows in bf16 both ways, in one pass over each pair of rows: row-major (the A tiles
// of S^T) and, for the first r columns, with the pair's values interleaved (V's B tiles: dword
// (p, c) = [row 2p col c | row 2p + 1 col c]). Rows past n are zero, so their values stay finite
// under a zero probability.
//
// The next chunk's rows are prefetched into L2 on the way, a line per row and step, so their reads
// from memory overlap this chunk's tile products (the rows sit in blocks anywhere in the cache,
// which the hardware prefetcher cannot follow across).
void AmxDecodeRows::load_chunk(const void* const* rows, Rows kind, int64_t n, const void* const* next, int64_t next_n) {
    const int64_t w = w_, r = r_;
    uint16_t* kb = kb_.data();
    uint16_t* vp = vp_.data();
    // vpermt2w indices: columns 0-15 (then 16-31) of the two rows, alternating.
    alignas(64) uint16_t lo_idx[32], hi_idx[32];
    for (int i = 0; i < 16; ++i) {
        lo_idx[2 * i] = static_cast<uint16_t>(i), lo_idx[2 * i + 1] = static_cast<uint16_t>(32 + i);
        hi_idx[2 * i] = static_cast<uint16_t>(16 + i), hi_idx[2 * i + 1] = static_cast<uint16_t>(48 + i);
    }
    const __m512i ilo = _mm512_load_si512(lo_idx), ihi = _mm512_load_si512(hi_idx);
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t p = 0; p < kRows / 2; ++p) {
        const int64_t j0 = 2 * p, j1 = 2 * p + 1;
        if (j0 >= n) {  // both rows past the chunk
            std::memset(kb + j0 * w, 0, 2 * w * sizeof(uint16_t));
            std::memset(vp + p * r * 2, 0, r * 2 * sizeof(uint16_t));
            continue;
        }
        const char* pf0 = j0 < next_n ? static_cast<const char*>(next[j0]) : nullptr;
        const char* pf1 = j1 < next_n ? static_cast<const char*>(next[j1]) : nullptr;
        const int64_t elt = kind == Rows::f32 ? 4 : 2;
        for (int64_t c = 0; c < w; c += 32) {
            if (pf0 != nullptr)
                for (int64_t b = c * elt; b < (c + 32) * elt; b += 64) _mm_prefetch(pf0 + b, _MM_HINT_T1);
            if (pf1 != nullptr)
                for (int64_t b = c * elt; b < (c + 32) * elt; b += 64) _mm_prefetch(pf1 + b, _MM_HINT_T1);
            const __m512i a = load32(rows[j0], kind, c);
            const __m512i b = j1 < n ? load32(rows[j1], kind, c) : zero;
            _mm512_storeu_si512(kb + j0 * w + c, a);
            _mm512_storeu_si512(kb + j1 * w + c, b);
            if (c < r) {
                _mm512_storeu_si512(vp + (p * r + c) * 2, _mm512_permutex2var_epi16(a, ilo, b));
                _mm512_storeu_si512(vp + (p * r + c + 16) * 2, _mm512_permutex2var_epi16(a, ihi, b));
            }
        }
    }
}

void AmxDecodeRows::chunk(const void* const* rows, Rows kind, int64_t n, float scale, const void* const* next,
                          int64_t next_n) {
    const int64_t w = w_, r = r_, ks = w / 32;
    const uint16_t* kb = kb_.data();
    const uint16_t* vp = vp_.data();
    uint16_t* pr = pr_.data();
    float* st = st_.data();
    load_chunk(rows, kind, n, next, next_n);
    const int kb_stride = static_cast<int>(w * 2), o_stride = static_cast<int>(r * 4);
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t g = 0; g < groups_; ++g) {
        // S^T [64 positions x 16 query rows] in tiles 0-3.
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t s = 0; s < ks; ++s) {
            _tile_loadd(5, qt_.data() + (g * ks + s) * 512, 64);
            _tile_loadd(4, kb + 0 * 16 * w + 32 * s, kb_stride);
            _tile_loadd(6, kb + 1 * 16 * w + 32 * s, kb_stride);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(7, kb + 2 * 16 * w + 32 * s, kb_stride);
            _tile_dpbf16ps(1, 6, 5);
            _tile_loadd(4, kb + 3 * 16 * w + 32 * s, kb_stride);
            _tile_dpbf16ps(2, 7, 5);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, st + 0 * 256, 64);
        _tile_stored(1, st + 1 * 256, 64);
        _tile_stored(2, st + 2 * 256, 64);
        _tile_stored(3, st + 3 * 256, 64);
        // Online softmax with the 16 query rows in the lanes.
        float* mxg = mx_.data() + 16 * g;
        float* lg = l_.data() + 16 * g;
        __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j < n; ++j) {
            const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(st + 16 * j), vscale);
            _mm512_storeu_ps(st + 16 * j, x);
            vmax = _mm512_max_ps(vmax, x);
        }
        const __m512 mold = _mm512_loadu_ps(mxg), mnew = _mm512_max_ps(mold, vmax);
        const __m512 alpha = exp_neg(_mm512_sub_ps(mold, mnew));  // 0 on the first chunk (-inf - m)
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; ++j) {
            const __m512 e = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(st + 16 * j), mnew));
            _mm512_storeu_ps(st + 16 * j, e);
            sum = _mm512_add_ps(sum, e);
        }
        for (int64_t j = n; j < kRows; ++j) _mm512_storeu_ps(st + 16 * j, _mm512_setzero_ps());
        _mm512_storeu_ps(lg, _mm512_fmadd_ps(_mm512_loadu_ps(lg), alpha, sum));
        _mm512_storeu_ps(mxg, mnew);
        float* og = ot_.data() + g * 16 * r;
        if (_mm512_cmp_ps_mask(alpha, _mm512_set1_ps(1.f), _CMP_NEQ_UQ)) {  // the running max moved
            alignas(64) float a[16];
            _mm512_store_ps(a, alpha);
            for (int i = 0; i < 16; ++i) {
                if (a[i] == 1.f) continue;
                const __m512 ai = _mm512_set1_ps(a[i]);
                for (int64_t c = 0; c < r; c += 16)
                    _mm512_storeu_ps(og + i * r + c, _mm512_mul_ps(_mm512_loadu_ps(og + i * r + c), ai));
            }
        }
        // P row-major in bf16: 16 query rows x 64 positions.
        for (int64_t b = 0; b < kRows / 16; ++b) {
            __m512 blk[16];
            for (int j = 0; j < 16; ++j) blk[j] = _mm512_loadu_ps(st + 16 * (16 * b + j));
            transpose16(blk);
            for (int i = 0; i < 16; ++i)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + i * kRows + 16 * b), to_bf16(blk[i]));
        }
        // O += P . V, 16 query rows x 32 columns a step (tiles 0-1), positions 0-31 and 32-63.
        _tile_loadd(6, pr, kRows * 2);
        _tile_loadd(7, pr + 32, kRows * 2);
        for (int64_t c = 0; c < r; c += 32) {
            _tile_loadd(0, og + c, o_stride);
            _tile_loadd(1, og + c + 16, o_stride);
            _tile_loadd(4, vp + (0 * r + c) * 2, o_stride);
            _tile_loadd(5, vp + (16 * r + c) * 2, o_stride);
            _tile_dpbf16ps(0, 6, 4);
            _tile_loadd(2, vp + (0 * r + c + 16) * 2, o_stride);
            _tile_dpbf16ps(0, 7, 5);
            _tile_loadd(3, vp + (16 * r + c + 16) * 2, o_stride);
            _tile_dpbf16ps(1, 6, 2);
            _tile_dpbf16ps(1, 7, 3);
            _tile_stored(0, og + c, o_stride);
            _tile_stored(1, og + c + 16, o_stride);
        }
    }
}

void AmxDecodeRows::end(float* mx, float* l, float* o, int64_t ldo) {
    _tile_release();
    for (int64_t i = 0; i < m_; ++i) {
        mx[i] = mx_[i];
        l[i] = l_[i];
        std::memcpy(o + i * ldo, ot_.data() + i * r_, r_ * sizeof(float));
    }
}

}  // namespace mla
