// The shared tile routine of the integer-weight ops (see qmatmul.hpp).
#include "qmatmul.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cpu_features.hpp"
#include "numeric.hpp"
#include "validate.hpp"
#if defined(MLA_HAVE_AMX)
#include "amx.hpp"
#include "qmatmul_amx.hpp"
#endif

namespace mla {

namespace {

constexpr int64_t kBlockK = 2048;  // inputs per dequantised k-block (32 rows x 2048 f32 = 256 KiB, in L2)

struct Scratch {
    std::vector<float> panel;
    std::vector<const float*> a, xs;
    std::vector<const uint16_t*> b;
    std::vector<QRow> q8;
    LineVector<uint16_t> lines;  // a 4-row block's fp8 codes widened to bf16 (QgemmIsa::widen_fp8_lines)
    LineVector<float> lanes;     // a tile's per-group factors of the int8 dots (QgemmIsa::q8_lanes)
    QBlock tile[kTileRows / 4];  // the tile's blocks pointing at them
};
thread_local Scratch tls;

#if defined(MLA_HAVE_AMX)
// Whether m int8 activation rows against K inputs take AMX-INT8 tiles here: from a decode batch of
// 8 rows (kAmxRows), on shapes the tiles step through, where the CPU and the OS allow them.
bool amx_rows(int64_t m, int64_t K, int64_t group) {
    return m >= kAmxRows && qtile_amx_fits(K, group) && kernels().amx_int8;
}
#endif

// The int8 forms of the activation rows `rows` (indices into acts), in this thread's scratch.
// Whether n rows of x against fp8 codes run on AMX-BF16 tiles (they then need bf16 rows).
bool amx_fp8_rows(int64_t n) {
#if defined(MLA_HAVE_AMX)
    return n >= kAmxRows && kernels().amx_bf16;
#else
    (void)n;
    return false;
#endif
}

const QRow* q8_rows(Scratch& s, const QActs& acts, const int64_t* rows, int64_t m) {
    s.q8.resize(m);
    for (int64_t t = 0; t < m; ++t) s.q8[t] = acts.q8(rows[t]);
    return s.q8.data();
}

// The bf16 forms of the activation rows `rows` (the fp8 codes' bf16 dots), in this thread's scratch.
const uint16_t* const* bf16_rows(Scratch& s, const QActs& acts, const int64_t* rows, int64_t m) {
    s.b.resize(m);
    for (int64_t t = 0; t < m; ++t) s.b[t] = acts.bf16(rows[t]);
    return s.b.data();
}

void check_u8(const char* op, const TensorView& t, int64_t rank) {
    check_rank(op, t, rank);
    if (t.dtype != DType::u8) fail(op, t, std::string("must be u8, got ") + dtype_name(t.dtype));
}

}  // namespace

void check_int4_zero_points(const char* op, const TensorView& zp) {
    const uint8_t* z = zp.ptr<uint8_t>();
    const int64_t n = zp.numel();
    uint8_t worst = 0;
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, z[i]);  // vectorised; the position only on failure
    if (worst <= 15) return;
    for (int64_t i = 0; i < n; ++i)
        if (z[i] > 15) fail(op, zp, "holds a zero point above 15 for int4 codes (" + std::to_string(z[i]) + " at " + std::to_string(i) + ")");
}

int64_t check_qweights(const char* op, const TensorView& q, const TensorView& s, const TensorView& zp, int64_t experts,
                       int64_t rows, int64_t in, int64_t bits, bool zp_checked) {
    const int64_t rank = experts > 0 ? 3 : 2, r0 = rank - 2;
    check_u8(op, q, rank);
    check_rank(op, s, rank);
    if (s.dtype != DType::f32) fail(op, s, std::string("must be f32, got ") + dtype_name(s.dtype));
    check_u8(op, zp, rank);
    const WeightFormat& fmt = *weight_format(bits);  // the ops checked bits first
    const int64_t per_byte = fmt.codes_per_byte;
    if (rows <= 0 || rows % 4 != 0) fail(op, q, "needs a positive number of output rows divisible by 4, got " + std::to_string(rows));
    if (in <= 0 || in % 32 != 0) fail(op, q, "needs a positive input size divisible by 32, got " + std::to_string(in));
    for (const TensorView* t : {&q, &s, &zp}) {
        if (experts > 0) check_dim(op, *t, 0, experts, "the number of experts");
        check_dim(op, *t, r0, rows, "the projection's output rows");
    }
    check_dim(op, q, r0 + 1, in / per_byte, per_byte == 2 ? "the input size / 2 (two int4 codes per byte)" : "the input size");
    const int64_t groups = s.dim(r0 + 1);
    if (groups <= 0 || in % groups != 0 || (in / groups) % fmt.group_multiple != 0)
        fail(op, s, "must have a group count G with input size / G a multiple of " + std::to_string(fmt.group_multiple) +
                        " (input size " + std::to_string(in) +
                        ", G " + std::to_string(groups) + ")");
    check_dim(op, zp, r0 + 1, groups, "the scales' group count");
    if (fmt.zero_point_max == 15 && !zp_checked) check_int4_zero_points(op, zp);
    return in / groups;
}

void quantize_row_q8(int64_t K, int64_t group, const float* x, int8_t* q, float* d, float* gsum) {
    const int64_t block = q8_block(group);
    for (int64_t b = 0; b < K / block; ++b) {
        const float* xb = x + block * b;
        float amax = 0.f;
        for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        for (int64_t j = 0; j < block; ++j) {
            const int32_t v = std::clamp(static_cast<int32_t>(std::nearbyint(xb[j] * inv)), -127, 127);
            q[block * b + j] = static_cast<int8_t>(v);
            sum += v;
        }
        finish_q8_block(b, block, group, scale, sum, d, gsum);
    }
}

void split_ranges(const Threading& th, int64_t n, const std::function<void(int64_t, int64_t)>& body) {
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(n, th.num_threads));
    dynamic_for(th, parts, [&](int64_t part) { body(n * part / parts, n * (part + 1) / parts); });
}

void split_for(const Threading& th, int64_t n, const std::function<void(int64_t)>& body) {
    split_ranges(th, n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) body(i);
    });
}

QMode qmode(bool reduced, const QgemmIsa& isa) {
    // The AVX-512 table's int8 dots are VNNI instructions, which an AVX-512 CPU may lack; the AVX2
    // table's (vpmaddubsw) run wherever the table does.
    const bool cpu_vnni = cpu_features().avx512_vnni;
    QMode m;
    m.q8_dots = reduced && isa.qdot_q8[0][0][0] != nullptr && (cpu_vnni || std::string(isa.name) != "avx512");
    return m;
}

QMode qmode_fp8(bool reduced, const QgemmIsa& isa) {
    const bool cpu_bf16 = cpu_features().avx512_bf16;
    QMode m;
    m.fp8_bf16 = reduced && cpu_bf16 && isa.qdot_fp8_bf16[0] != nullptr;
    m.fp8_lines = m.fp8_bf16 && kernels().fp8_lut && isa.widen_fp8_lines != nullptr;
    return m;
}

QBlock QWeights::block(int64_t r0) const {
    QBlock b;
    b.q = q + r0 * row_bytes;  // blocks of 4 interleaved rows: the block starts at its first row's offset
    for (int r = 0; r < 4; ++r) {
        b.s[r] = s + (r0 + r) * groups;
        b.zp[r] = zp + (r0 + r) * groups;
    }
    return b;
}

QActs::QActs(const float* x, int64_t n, int64_t K, int64_t group, QMode mode, bool want_q8, const QgemmIsa& isa,
             const Threading& th)
    : x_(x), K_(K), G_(K / group) {
    if (mode.fp8_bf16 && (want_q8 || amx_fp8_rows(n))) {  // fp8 codes' bf16 rows (round to nearest even)
        b_.resize(n * K);
        for (int64_t i = 0; i < n * K; ++i) b_[i] = f32_to_bf16(x[i]);
        return;
    }
    if (want_q8 && mode.q8_dots) {
        q_.resize(n * K);
        block_ = q8_block(group);
        d_.resize(n * (K / block_));
        gsum_.resize(n * G_);
        const auto quantize = [&](int64_t i) {
            isa.quantize_q8(K, group, x + i * K, q_.data() + i * K, d_.data() + i * (K / block_), gsum_.data() + i * G_);
        };
        if (n >= kParallelQuantizeRows)  // prefill: every row of a chunk, on every core
            split_for(th, n, quantize);
        else
            for (int64_t i = 0; i < n; ++i) quantize(i);
    } else {
        sums_.resize(n * G_);  // the f32 dot products' zero-point term
        for (int64_t i = 0; i < n; ++i)
            for (int64_t g = 0; g < G_; ++g) {
                float s = 0.f;
                const float* p = x + i * K + g * group;
                for (int64_t j = 0; j < group; ++j) s += p[j];
                sums_[i * G_ + g] = s;
            }
    }
}

QRow QActs::q8(int64_t i) const {
    return QRow{q_.data() + i * K_, d_.data() + i * (K_ / block_), gsum_.data() + i * G_, block_};
}

void qtile(const QgemmIsa& isa, int bi, const QActs& acts, const int64_t* rows, int64_t m, const QBlock* blocks,
           int64_t K, int64_t group, float* c, int64_t many_from, int few_nb) {
    Scratch& s = tls;
#if defined(MLA_HAVE_AMX)
    // fp8 codes from 8 rows of bf16 activations: AMX-BF16 tiles where the CPU has them
    if (acts.has_bf16() && m >= kAmxRows && K % 32 == 0 && kernels().amx_bf16)
        return qtile_fp8_amx(acts, rows, m, blocks, K, group, c);
#endif
    if (m < many_from) {
        if (acts.has_bf16()) {  // fp8 codes on bf16 rows
            const uint16_t* const* x = bf16_rows(s, acts, rows, m);
            // the codes widened by lookups (fp8_codes=lut), 8 tokens a pass, each code widened once
            // for them; else by shifts, 4 a pass
            const bool lut = kernels().fp8_lut && isa.qdot_fp8_bf16_lut[0] != nullptr;
            const int64_t step = lut ? 8 : 4;
            if (lut && m > step && isa.widen_fp8_lines != nullptr) {
                // more than one pass: each block's codes widened once into bf16 lines (in L1: 8 KB a
                // 1024 inputs), which every pass reads
                s.lines.resize(4 * K);
                for (int64_t r0 = 0; r0 < kTileRows; r0 += 4) {
                    isa.widen_fp8_lines(K, blocks[r0 / 4].q, s.lines.data());
                    for (int64_t t0 = 0; t0 < m; t0 += step) {
                        const int64_t mt = std::min<int64_t>(step, m - t0);
                        isa.qdot_bf16_lines[mt - 1](K, group, x + t0, s.lines.data(), blocks[r0 / 4],
                                                    c + t0 * kTileRows + r0, kTileRows);
                    }
                }
                return;
            }
            for (int64_t r0 = 0; r0 < kTileRows; r0 += 4)
                for (int64_t t0 = 0; t0 < m; t0 += step) {
                    const int64_t mt = std::min<int64_t>(step, m - t0);
                    (lut ? isa.qdot_fp8_bf16_lut : isa.qdot_fp8_bf16)[mt - 1](
                        K, group, x + t0, blocks[r0 / 4], c + t0 * kTileRows + r0, kTileRows);
                }
            return;
        }
        // rows outside, tokens inside: a second chunk of tokens finds the 4 rows' codes in cache
        if (acts.has_q8()) {
#if defined(MLA_HAVE_AMX)
            // From a decode batch of 8 rows on AMX-INT8 tiles where the CPU has them (same sums).
            if (amx_rows(m, K, group)) return qtile_amx(bi, acts, rows, m, blocks, K, group, c);
#endif
            const QRow* x = q8_rows(s, acts, rows, m);
            // 1-2 rows: few_nb blocks of 4 weight rows a call (memory-bound: 1, one stream, unless the
            // caller pairs two streams); more: 8 (the broadcasts of the activations shared by two
            // blocks), 4 activation rows a call (qgemm_impl.hpp's measurements)
            const int nb = m <= 2 ? few_nb : 2;
            const int64_t groups = K / group;
            if (m > 4 && groups > 1 && isa.q8_lanes != nullptr) {
                // Several passes of 4 tokens over each block: its per-group factors made once for all of
                // them, not at every group of every pass. Time against the same projection in int8
                // (per channel: one group), Zen 4, 2 threads, alternated: 2048 x 10944 int4 in groups
                // of 64 at 1024 rows 1.59-1.60x -> 1.32-1.33x; 3072 x 2048 in groups of 128 at 512
                // rows 1.15-1.23x -> 1.03-1.07x.
                s.lanes.resize(kTileRows / 4 * groups * kQ8LaneFloats);
                for (int64_t b = 0; b < kTileRows / 4; ++b) {
                    s.tile[b] = blocks[b];
                    s.tile[b].lanes = s.lanes.data() + b * groups * kQ8LaneFloats;
                    isa.q8_lanes(groups, blocks[b], s.lanes.data() + b * groups * kQ8LaneFloats);
                }
                blocks = s.tile;
            }
            for (int64_t r0 = 0; r0 < kTileRows; r0 += 4 * nb)
                for (int64_t t0 = 0; t0 < m; t0 += 4) {
                    const int64_t mt = std::min<int64_t>(4, m - t0);
                    isa.qdot_q8[bi][nb - 1][mt - 1](K, group, x + t0, blocks + r0 / 4,
                                                    c + t0 * kTileRows + r0, kTileRows);
                }
            return;
        }
        s.a.resize(m);
        s.xs.resize(m);
        for (int64_t t = 0; t < m; ++t) s.a[t] = acts.row(rows[t]), s.xs[t] = acts.sums(rows[t]);
        for (int64_t r0 = 0; r0 < kTileRows; r0 += 4)
            for (int64_t t0 = 0; t0 < m; t0 += 4) {
                const int64_t mt = std::min<int64_t>(4, m - t0);
                isa.qdot[bi][mt - 1](K, group, s.a.data() + t0, s.xs.data() + t0, blocks[r0 / 4],
                                     c + t0 * kTileRows + r0, kTileRows);
            }
        return;
    }
    std::fill(c, c + m * kTileRows, 0.f);
    const int64_t kb_max = std::min<int64_t>(K, kBlockK);
    if (static_cast<int64_t>(s.panel.size()) < kTileRows * kb_max) s.panel.resize(kTileRows * kb_max);
    float* w = s.panel.data();
    s.a.resize(m);
    for (int64_t t = 0; t < m; ++t) s.a[t] = acts.row(rows[t]);
    for (int64_t k0 = 0; k0 < K; k0 += kb_max) {
        const int64_t kb = std::min(kb_max, K - k0);
        isa.dequant[bi](kTileRows / 4, blocks, k0, kb, group, w);
        for (int64_t t0 = 0; t0 < m; t0 += 4) {
            const int64_t mt = std::min<int64_t>(4, m - t0);
            for (int64_t r0 = 0; r0 < kTileRows; r0 += 4)
                isa.fdot[mt - 1](k0, kb, s.a.data() + t0, w + r0 * kb, c + t0 * kTileRows + r0, kTileRows);
        }
    }
}

void qtile16(const QgemmIsa& isa, int bi, const QActs& acts, const int64_t* rows, int64_t m, const uint8_t* q,
             const float* s, const uint8_t* zp, int64_t groups, int64_t K, int64_t group, float* c, int64_t step,
             bool paired) {
#if defined(MLA_HAVE_AMX)
    if (bi == 0 && step == kTile16Rows && amx_rows(m, K, group))
        return qtile16_amx(acts, rows, m, q, s, zp, groups, K, group, c);
#endif
    const QRow* x = q8_rows(tls, acts, rows, m);
    if (m <= 2 && !paired) {  // memory-bound: one 16-row tile a call, one stream in 4 accumulator chains
        const int64_t tile_bytes = step * K / kWeightFormats[bi].codes_per_byte;
        for (int64_t b = 0; b < kTileRows / kTile16Rows; ++b)
            isa.qdot_q8_t16[bi][0][m - 1](K, group, x, q + b * tile_bytes, s + b * step * groups, zp + b * step * groups,
                                          groups, kTile16Rows, c + b * kTile16Rows, kTileRows);
        return;
    }
    // both 16-row tiles a call (the activations' broadcasts shared), 4 activation rows a call: the
    // second call finds the 32 rows' codes in cache (1-2 rows, paired: the two tiles side by side)
    for (int64_t t0 = 0; t0 < m; t0 += 4) {
        const int64_t mt = std::min<int64_t>(4, m - t0);
        isa.qdot_q8_t16[bi][1][mt - 1](K, group, x + t0, q, s, zp, groups, step, c + t0 * kTileRows, kTileRows);
    }
}

bool tile16_fp8_dots(const QgemmIsa& isa, const QMode& mode) {
    return mode.fp8_bf16 && kernels().fp8_lut && isa.qdot_fp8_t16[0][0] != nullptr;
}

void qtile16_fp8(const QgemmIsa& isa, const QActs& acts, const int64_t* rows, int64_t m, const uint8_t* q,
                 const float* s, int64_t groups, int64_t K, int64_t group, float* c, int64_t step) {
    const uint16_t* const* x = bf16_rows(tls, acts, rows, m);
    if (m <= 2) {  // memory-bound: one 16-row tile a call, one stream
        for (int64_t b = 0; b < kTileRows / kTile16Rows; ++b)
            isa.qdot_fp8_t16[0][m - 1](K, group, x, q + b * step * K, s + b * step * groups, groups, kTile16Rows,
                                       c + b * kTile16Rows, kTileRows);
        return;
    }
    // both tiles a call (each token's pair loaded once for 32 rows), up to 8 tokens a pass; a further
    // pass finds the 32 rows' codes in cache and widens them again (6 instructions a line against
    // the pass's 16 dot products)
    for (int64_t t0 = 0; t0 < m; t0 += 8) {
        const int64_t mt = std::min<int64_t>(8, m - t0);
        isa.qdot_fp8_t16[1][mt - 1](K, group, x + t0, q, s, groups, step, c + t0 * kTileRows, kTileRows);
    }
}

void tile16_to_rows4(const uint8_t* src, int64_t rows, int64_t row_bytes, uint8_t* dst) {
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* tile = src + (r / kTile16Rows) * kTile16Rows * row_bytes + 4 * (r % kTile16Rows);
        uint8_t* block = dst + (r / 4) * 4 * row_bytes + 16 * (r % 4);  // chunk c of the row at block + 64c
        for (int64_t j = 0; j < row_bytes; j += 4)
            std::memcpy(block + (j / 16) * 64 + j % 16, tile + 16 * j, 4);
    }
}

QWeights rows4_view(const QWeights& w, int64_t row, int64_t rows, Rows4Scratch& scratch) {
    scratch.q.resize(rows * w.row_bytes);
    tile16_to_rows4(w.q + row * w.row_bytes, rows, w.row_bytes, scratch.q.data());
    scratch.s.resize(rows * w.groups);
    scratch.zp.resize(rows * w.groups);
    const float* s = w.s + row * w.groups;  // the first tile's factors
    const uint8_t* zp = w.zp + row * w.groups;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < w.groups; ++g) {
            scratch.s[r * w.groups + g] = s[tile16_factor(r, g, w.groups)];
            scratch.zp[r * w.groups + g] = zp[tile16_factor(r, g, w.groups)];
        }
    return QWeights{scratch.q.data(), scratch.s.data(), scratch.zp.data(), w.row_bytes, w.groups};
}

void qtile_at(const QgemmIsa& isa, int bits_index, const QActs& acts, const int64_t* rows, int64_t m, const QWeights& w,
              int64_t row, bool tile16, bool t16_dots, int64_t K, int64_t group, float* c, int64_t many_from) {
    if (tile16 && t16_dots && bits_index == weight_code_index(kFp8Bits))
        return qtile16_fp8(isa, acts, rows, m, w.q + row * w.row_bytes, w.s + row * w.groups, w.groups, K, group, c);
    if (tile16 && t16_dots)
        return qtile16(isa, bits_index, acts, rows, m, w.q + row * w.row_bytes, w.s + row * w.groups, w.zp + row * w.groups,
                       w.groups, K, group, c);
    QWeights tw = w;
    int64_t first = row;
    if (tile16) {  // a kernel of the 4-row layout: this item's codes rewritten into it first
        thread_local Rows4Scratch rows4;
        tw = rows4_view(w, row, kTileRows, rows4);
        first = 0;
    }
    QBlock blocks[kTileRows / 4];
    for (int64_t j = 0; j < kTileRows / 4; ++j) blocks[j] = tw.block(first + 4 * j);
    qtile(isa, bits_index, acts, rows, m, blocks, K, group, c, many_from);
}

}  // namespace mla
