// MlaQLinear (see qlinear.hpp): work items are tiles of 32 output columns, each over every row of x.
#include "qlinear.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "kernel_config.hpp"
#include "numeric.hpp"
#include "qmatmul.hpp"
#include "validate.hpp"

namespace mla {

namespace {

constexpr const char* kOp = "MlaQLinear";
constexpr int64_t kStreamRows = 16;  // up to this many rows of x, the codes are streamed once

struct Dims {
    int64_t M, K, N, group;
};

Dims check_all(const QLinearInputs& in, int64_t bits) {
    if (!weight_bits_valid(bits))
        throw Error(std::string(kOp) + ": attribute 'bits' must be " + kWeightBitsExpected + ", got " + std::to_string(bits));
    if (in.x.rank() < 2) fail(kOp, in.x, "must have rank 2 or more ([..., K]), got rank " + std::to_string(in.x.rank()));
    check_float(kOp, in.x);  // the CPU plugin hands bf16 activations to custom ops under a bf16 hint
    Dims d{};
    d.K = in.x.dim(in.x.rank() - 1);
    d.M = in.x.numel() / (d.K > 0 ? d.K : 1);
    check_rank(kOp, in.w_q, 2);
    check_qlinear_layout(kOp, in.tile16, bits);
    d.N = in.w_q.dim(0);
    if (d.N % kTileRows != 0)
        fail(kOp, in.w_q, "needs an output size divisible by 32, got " + std::to_string(d.N));
    d.group = check_qweights(kOp, in.w_q, in.w_s, in.w_zp, 0, d.N, d.K, bits, in.zero_points_checked);
    return d;
}

}  // namespace

bool layout_is_tile16(const char* op, const std::string& layout) {
    if (layout == "rows4") return false;
    if (layout == "tile16") return true;
    throw Error(std::string(op) + ": attribute 'layout' must be rows4 or tile16, got '" + layout + "'");
}

void check_qlinear_layout(const char* op, bool tile16, int64_t bits, const char* bits_attr) {
    const WeightFormat* format = weight_format(bits);
    if (!tile16 || (format != nullptr && format->tile16)) return;
    std::string allowed;
    for (const WeightFormat& f : kWeightFormats)
        if (f.tile16) allowed += (allowed.empty() ? "" : " or ") + std::to_string(f.bits) + " (" + f.name + ")";
    throw Error(std::string(op) + ": attribute 'layout' must be rows4, or tile16 with " + bits_attr + " " + allowed +
                "; got 'tile16' with " + bits_attr + " " + std::to_string(bits));
}

std::vector<std::pair<size_t, const char*>> int4_zero_point_inputs(int64_t bits) {
    if (bits != 4) return {};
    return {{3, "w_zp"}};
}

std::vector<int64_t> qlinear_shape(const QLinearInputs& in, int64_t bits) {
    const Dims d = check_all(in, bits);
    std::vector<int64_t> shape(in.x.shape.begin(), in.x.shape.end() - 1);
    shape.push_back(d.N);
    return shape;
}

void qlinear(const QLinearInputs& in, int64_t bits, const TensorView& out, const Threading& th, Compute compute) {
    const Dims d = check_all(in, bits);
    if (out.dtype != DType::f32) fail(kOp, out, std::string("must be f32, got ") + dtype_name(out.dtype));
    if (d.M == 0) return;
    const QgemmIsa& isa = *kernels().qgemm;
    // fp8 codes: bf16 or f32 dots, never int8 activations (qmode_fp8)
    const bool reduced = compute == Compute::bf16;
    const QMode mode = bits == kFp8Bits ? qmode_fp8(reduced, isa) : qmode(reduced, isa);
    std::vector<float> x_f32;
    const float* x = in.x.ptr<float>();
    if (in.x.dtype != DType::f32) {  // a copy only when the runtime passed bf16 or f16
        x_f32.resize(d.M * d.K);
        to_f32(in.x.data, in.x.dtype, x_f32.data(), d.M * d.K);
        x = x_f32.data();
    }
    const int64_t many_from = many_rows(mode);
    const bool many = d.M >= many_from;
    const QActs acts(x, d.M, d.K, d.group, mode, !many, isa, th);
    std::vector<int64_t> rows(d.M);
    for (int64_t i = 0; i < d.M; ++i) rows[i] = i;
    const QWeights w{in.w_q.ptr<uint8_t>(), in.w_s.ptr<float>(), in.w_zp.ptr<uint8_t>(), in.w_q.dim(1), d.K / d.group};
    const int bi = weight_code_index(bits);
    const bool t16 = tile16_runs(isa, bits, mode, acts);
    float* y = out.ptr<float>();
    // Decode's few rows (a step's sequences): one pass over the codes, each core streaming one run
    // of them (split_for). More rows (prefill): work items are (block of rows, tile), handed out
    // dynamically, so a tile's activation rows stay in L2 while its codes or panel are applied to
    // them (all of a 2048-token chunk's rows streamed from L3 once per tile took 1.6x the plugin's
    // time against 1.26x at 1024 rows, in the former bf16 panels).
    const bool stream = d.M <= kStreamRows;
    const int64_t row_block = stream ? d.M : std::min<int64_t>(d.M, kQLinearRowBlock);
    const int64_t n_row_blocks = (d.M + row_block - 1) / row_block, n_tiles = d.N / kTileRows;
    const auto tile_at = [&](int64_t item) {
        const int64_t n0 = (item % n_tiles) * kTileRows, r0 = (item / n_tiles) * row_block;
        const int64_t m = std::min(row_block, d.M - r0);
        thread_local std::vector<float> tile;
        if (static_cast<int64_t>(tile.size()) < m * kTileRows) tile.resize(m * kTileRows);
        float* c = tile.data();
        // every row block of a call takes the call's form (acts holds its rows for that form only; the
        // last block may be shorter than many_from)
        qtile_at(isa, bi, acts, rows.data() + r0, m, w, n0, in.tile16, t16, d.K, d.group, c, many ? 0 : many_from);
        for (int64_t t = 0; t < m; ++t)
            for (int64_t j = 0; j < kTileRows; ++j) y[(r0 + t) * d.N + n0 + j] = c[t * kTileRows + j];
    };
    // 1-2 rows of int8 / int4 tiles: each core streams its run of tiles as two streams side by side,
    // the run's first half against its second (tile i with tile i + half, as the MoE reads an
    // expert's gate and up tiles), instead of one. The op alone, this against one tile at a time
    // linked into one process, alternated (Zen 4, 2 threads, 9 rounds, two runs, the read at
    // 30-50 GB/s): int8 lm_heads 1 row 1.00-1.04x (102400 x 2048) and 1.05-1.24x (129280 x 7168),
    // 2 rows 1.22x; int4 (groups of 128) 1.10-1.11x; projections cycled through 64-128 copies (their
    // weights from memory, as in a model's step) 0.93-1.06x (2048 x 2048), 1.03-1.06x (3072, 576
    // rows), int4 2816 rows 1.03-1.05x.
    const bool two_streams = stream && d.M <= 2 && in.tile16 && t16 && bits != kFp8Bits;
    const auto pair_at = [&](int64_t a, int64_t b) {  // tiles a < b: rows a * 32.. and b * 32..
        const int64_t n0 = a * kTileRows, step = (b - a) * kTileRows;
        float c[2 * kTileRows];  // per row t: tile a's 16-row half, then tile b's
        for (int64_t h = 0; h < kTileRows; h += kTile16Rows) {
            const int64_t r = n0 + h;
            qtile16(isa, bi, acts, rows.data(), d.M, w.q + r * w.row_bytes, w.s + r * w.groups, w.zp + r * w.groups,
                    w.groups, d.K, d.group, c, step, /*paired=*/true);
            for (int64_t t = 0; t < d.M; ++t)
                for (int64_t j = 0; j < kTile16Rows; ++j) {
                    y[t * d.N + r + j] = c[t * kTileRows + j];
                    y[t * d.N + r + step + j] = c[t * kTileRows + kTile16Rows + j];
                }
        }
    };
    if (two_streams)
        split_ranges(th, n_tiles, [&](int64_t begin, int64_t end) {
            const int64_t half = (end - begin) / 2;
            for (int64_t i = begin; i < begin + half; ++i) pair_at(i, i + half);
            if ((end - begin) % 2) tile_at(end - 1);
        });
    else if (stream)
        split_for(th, n_tiles, tile_at);
    else
        dynamic_for(th, n_row_blocks * n_tiles, tile_at);
}

}  // namespace mla
