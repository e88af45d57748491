// AMX bf16 tiles for the absorbed decode rows (see attention_amx.hpp). Compiled with
// -mamx-tile -mamx-bf16 -mavx512f/bw/vl/dq -mavx512bf16 (CMakeLists.txt); entered only when
// the kernel configuration allows it (kernel_config.hpp: amx_bf16).
#include "attention_amx.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "amx.hpp"
#include "bf16_rows.hpp"

namespace mla {
namespace {

const TileConfig kConfig;

// v's 16 values in bf16, as the low half (lo) and as the high half (hi) of 16 dwords, the other
// half zero: A-tile rows whose products with a B tile take only the even (lo) or only the odd (hi)
// value of each of B's pairs (how P . V and amx_up_project read B's rows as they lie).
inline void store_pair_halves(__m512 v, uint32_t* lo, uint32_t* hi) {
    const __m512i low = _mm512_cvtepu16_epi32(to_bf16(v));
    _mm512_storeu_si512(lo, low);
    _mm512_storeu_si512(hi, _mm512_slli_epi32(low, 16));
}

// Those products' outputs back in order: 16 even and 16 odd columns -> 32 columns.
struct EvenOddOrder {
    __m512i first, second;  // permutex2var indices of columns 0-15 and 16-31
    EvenOddOrder() {
        alignas(64) int32_t a[16], b[16];
        for (int j = 0; j < 8; ++j) {
            a[2 * j] = j, a[2 * j + 1] = 16 + j;
            b[2 * j] = 8 + j, b[2 * j + 1] = 24 + j;
        }
        first = _mm512_load_si512(a), second = _mm512_load_si512(b);
    }
    void store(const float* even, const float* odd, float* dst) const {
        const __m512 e = _mm512_loadu_ps(even), o = _mm512_loadu_ps(odd);
        _mm512_storeu_ps(dst, _mm512_permutex2var_ps(e, first, o));
        _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(e, second, o));
    }
};

}  // namespace

void AmxDecodeRows::begin(const float* q, int64_t m, int64_t w, int64_t r) {
    m_ = m, w_ = w, r_ = r, groups_ = (m + 15) / 16;
    const int64_t ks = w / 32;
    qt_.resize(groups_ * ks * 512);
    pack_qt_tiles(q, m, w, qt_.data());  // Q^T's B tiles (bf16_rows.hpp)
    kb_.resize(kRows * w);
    pe_.resize(kGroups * 256);
    po_.resize(kGroups * 256);
    st_.resize(kRows * 16);
    ot_.assign(groups_ * 16 * r, 0.f);
    mx_.assign(groups_ * 16, -std::numeric_limits<float>::infinity());
    l_.assign(groups_ * 16, 0.f);
    _tile_loadconfig(&kConfig);
}

// One chunk: S^T = K . Q^T (cache rows as A tiles, Q^T pairs as B), the online softmax with the
// 16 query rows in the lanes, then O += P . V with V's rows as B tiles as they lie. A tile product
// reduces over pairs of adjacent values of B's columns, so P enters twice, once with each
// probability in the low bf16 of its pair and once in the high one (the other half zero): the
// first product sums P . V's even columns, the second the odd ones (O's 32-column groups keep
// 16 even then 16 odd columns; end() puts them back in order). That is twice the tile products
// of a pair-interleaved copy of V, but no copy: the products were never the bound, the copy's
// stores were.
void AmxDecodeRows::chunk(const void* const* rows, Rows kind, int64_t n, float scale, const void* const* next,
                          int64_t next_n) {
    const int64_t w = w_, r = r_, ks = w / 32;
    const uint16_t* base[kGroups];
    int64_t stride[kGroups];
    const int64_t ng = place_row_groups(rows, kind, n, w, kb_.data(), base, stride);  // bf16_rows.hpp
    float* st = st_.data();
    // The next chunk's rows are fetched into L2 across the score products (the rows sit in blocks
    // anywhere in the cache, which the hardware prefetcher cannot follow across).
    const int64_t row_lines = (w * (kind == Rows::f32 ? 4 : 2) + 63) / 64, lines = next_n * row_lines;
    const int64_t per_step = (lines + ks - 1) / ks;  // ks steps x per_step >= lines: all of them
    // The next line to fetch, as (row, line in the row): counters, not an integer division per
    // line (the op at batch 8 x 1040 rows, f16 cache, warm: 0.98-1.07 -> 0.93-0.94 ms).
    int64_t pr = 0, pl = 0;
    const auto prefetch = [&](int64_t k) {
        for (; k > 0 && pr < next_n; --k) {
            _mm_prefetch(static_cast<const char*>(next[pr]) + 64 * pl, _MM_HINT_T1);
            if (++pl == row_lines) pl = 0, ++pr;
        }
    };
    const int s0 = static_cast<int>(stride[0]), s1 = ng > 1 ? static_cast<int>(stride[1]) : 0;
    const int s2 = ng > 2 ? static_cast<int>(stride[2]) : 0, s3 = ng > 3 ? static_cast<int>(stride[3]) : 0;
    const int o_stride = static_cast<int>(r * 4);
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t g = 0; g < groups_; ++g) {
        // S^T [16 ng positions x 16 query rows] in tiles 0..ng-1.
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t s = 0; s < ks; ++s) {
            _tile_loadd(5, qt_.data() + (g * ks + s) * 512, 64);
            _tile_loadd(4, base[0] + 32 * s, s0);
            _tile_dpbf16ps(0, 4, 5);
            if (ng > 1) {
                _tile_loadd(6, base[1] + 32 * s, s1);
                _tile_dpbf16ps(1, 6, 5);
            }
            if (ng > 2) {
                _tile_loadd(7, base[2] + 32 * s, s2);
                _tile_dpbf16ps(2, 7, 5);
            }
            if (ng > 3) {
                _tile_loadd(4, base[3] + 32 * s, s3);
                _tile_dpbf16ps(3, 4, 5);
            }
            if (g == 0) prefetch(per_step);
        }
        _tile_stored(0, st + 0 * 256, 64);
        if (ng > 1) _tile_stored(1, st + 1 * 256, 64);
        if (ng > 2) _tile_stored(2, st + 2 * 256, 64);
        if (ng > 3) _tile_stored(3, st + 3 * 256, 64);
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
        for (int64_t j = n; j < 16 * ng; ++j) _mm512_storeu_ps(st + 16 * j, _mm512_setzero_ps());
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
        // P's A tiles, 16 query rows x 16 positions each: dword p of row i is probability
        // (i, 16b + p) in bf16, in its low half (pe_) or its high half (po_).
        uint32_t* pe = pe_.data();
        uint32_t* po = po_.data();
        for (int64_t b = 0; b < ng; ++b) {
            __m512 blk[16];
            for (int j = 0; j < 16; ++j) blk[j] = _mm512_loadu_ps(st + 16 * (16 * b + j));
            transpose16(blk);
            for (int i = 0; i < 16; ++i) store_pair_halves(blk[i], pe + (b * 16 + i) * 16, po + (b * 16 + i) * 16);
        }
        // O += P . V, 64 columns a step: tiles 0-1 even / odd columns of the first 32, 2-3 of the
        // next 32.
        for (int64_t c = 0; c < r; c += 64) {
            _tile_loadd(0, og + c, o_stride);
            _tile_loadd(1, og + c + 16, o_stride);
            _tile_loadd(2, og + c + 32, o_stride);
            _tile_loadd(3, og + c + 48, o_stride);
            for (int64_t b = 0; b < ng; ++b) {
                const int sb = static_cast<int>(stride[b]);
                _tile_loadd(6, pe + b * 256, 64);
                _tile_loadd(4, base[b] + c, sb);
                _tile_dpbf16ps(0, 6, 4);
                _tile_loadd(7, po + b * 256, 64);
                _tile_dpbf16ps(1, 7, 4);
                _tile_loadd(5, base[b] + c + 32, sb);
                _tile_dpbf16ps(2, 6, 5);
                _tile_dpbf16ps(3, 7, 5);
            }
            _tile_stored(0, og + c, o_stride);
            _tile_stored(1, og + c + 16, o_stride);
            _tile_stored(2, og + c + 32, o_stride);
            _tile_stored(3, og + c + 48, o_stride);
        }
    }
}

void AmxDecodeRows::end(float* mx, float* l, float* o, int64_t ldo) {
    _tile_release();
    // Columns back in order: each 32-column group holds its 16 even then its 16 odd columns.
    const EvenOddOrder order;
    for (int64_t i = 0; i < m_; ++i) {
        mx[i] = mx_[i];
        l[i] = l_[i];
        const float* src = ot_.data() + i * r_;
        for (int64_t c = 0; c < r_; c += 32) order.store(src + c, src + c + 16, o + i * ldo + c);
    }
}

bool amx_up_project_fits(int64_t n, int64_t k) { return n > 0 && k > 0 && n % 64 == 0 && k % 16 == 0; }

namespace {
// Per-thread buffers of amx_up_project: A's tiles (low / high halves) for every 16 inputs of k,
// and the four output tiles of a 64-column step.
struct UpProjectScratch {
    LineVector<uint32_t> lo, hi;
    alignas(64) float out[4][256];
};
thread_local UpProjectScratch tls_up;
}  // namespace

void amx_up_project(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* w, int64_t ldw,
                    float* c, int64_t ldc) {
    UpProjectScratch& sc = tls_up;
    const int64_t kt = k / 16;
    sc.lo.resize(kt * 256);
    sc.hi.resize(kt * 256);
    const EvenOddOrder order;
    const int w_stride = static_cast<int>(ldw * 2);
    for (int64_t i0 = 0; i0 < m; i0 += 16) {
        const int rows = static_cast<int>(std::min<int64_t>(16, m - i0));
        TileConfig cfg;  // tiles 0-3 C, 6-7 A: `rows` rows; 4-5 B: 16 rows of k
        for (int t = 0; t < 8; ++t) cfg.rows[t] = (t == 4 || t == 5) ? 16 : static_cast<uint8_t>(rows);
        _tile_loadconfig(&cfg);
        for (int64_t t = 0; t < kt; ++t)
            for (int i = 0; i < rows; ++i)
                store_pair_halves(_mm512_loadu_ps(a + (i0 + i) * lda + 16 * t), sc.lo.data() + t * 256 + 16 * i,
                                  sc.hi.data() + t * 256 + 16 * i);
        for (int64_t j = 0; j < n; j += 64) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            // The next 64 columns' lines of the same rows, fetched meanwhile (W's rows are strided:
            // the hardware prefetcher does not run ahead across them). Once, on the first 16 tokens.
            const bool prefetch = i0 == 0 && j + 64 < n;
            for (int64_t t = 0; t < kt; ++t) {
                const uint16_t* b = w + 16 * t * ldw + j;
                if (prefetch)
                    for (int r = 0; r < 16; ++r) {
                        _mm_prefetch(reinterpret_cast<const char*>(b + r * ldw + 64), _MM_HINT_T0);
                        _mm_prefetch(reinterpret_cast<const char*>(b + r * ldw + 96), _MM_HINT_T0);
                    }
                _tile_loadd(6, sc.lo.data() + t * 256, 64);
                _tile_loadd(4, b, w_stride);
                _tile_dpbf16ps(0, 6, 4);
                _tile_loadd(7, sc.hi.data() + t * 256, 64);
                _tile_dpbf16ps(1, 7, 4);
                _tile_loadd(5, b + 32, w_stride);
                _tile_dpbf16ps(2, 6, 5);
                _tile_dpbf16ps(3, 7, 5);
            }
            _tile_stored(0, sc.out[0], 64);
            _tile_stored(1, sc.out[1], 64);
            _tile_stored(2, sc.out[2], 64);
            _tile_stored(3, sc.out[3], 64);
            for (int i = 0; i < rows; ++i)
                for (int h = 0; h < 2; ++h)
                    order.store(sc.out[2 * h] + 16 * i, sc.out[2 * h + 1] + 16 * i, c + (i0 + i) * ldc + j + 32 * h);
        }
    }
    _tile_release();
}

}  // namespace mla
