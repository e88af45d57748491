// MlaMoeExperts (see moe_experts.hpp): routing into per-expert token lists, then two phases.
//
// Phase 1, gate_up: work items are (expert, 16 intermediate columns); each computes the gate and
// up rows of those columns for the expert's tokens and writes silu(gate) * up into act[pair, :],
// pairs ordered by (expert, token). Phase 2, down: work items are 32 output columns; each walks the
// experts in ascending order and adds weight * (act @ down_e^T) onto its columns of every token,
// so no two items write the same element and each token's sum runs in ascending expert order.
// Both phases use one tile routine (qmatmul.hpp): under compute = bf16 (the runtime's bf16 hint)
// on AVX2/VNNI CPUs, int8-activation dot products on the codes for any number of tokens; in f32, dot
// products on the codes for few tokens (one pass over the weights, which is all decode needs) and
// a panel of rows dequantised once per k-block for many.
#include "moe_experts.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "aligned_vector.hpp"
#include "kernel_config.hpp"
#include "qlinear.hpp"
#include "qgemm.hpp"
#include "numeric.hpp"
#include "qmatmul.hpp"
#include "validate.hpp"
#include "vec_exp.hpp"

namespace mla {

namespace {

constexpr const char* kOp = "MlaMoeExperts";
constexpr int64_t kPanel = kTileRows;  // weight rows per tile (phase 1: 16 gate + 16 up rows)

struct Dims {
    int64_t T, H, k, E, I, g13, g2;
};

Dims check_all(const MoeInputs& in, MoeBits bits) {
    for (auto [name, b] : {std::make_pair("w13_bits", bits.w13), std::make_pair("w2_bits", bits.w2)})
        if (!weight_bits_valid(b))
            throw Error(std::string(kOp) + ": attribute '" + name + "' must be " + kWeightBitsExpected + ", got " +
                        std::to_string(b));
    check_rank(kOp, in.x, 2);
    check_float(kOp, in.x);  // the CPU plugin hands bf16 activations to custom ops under a bf16 hint
    check_rank(kOp, in.topk_ids, 2);
    check_index(kOp, in.topk_ids);
    check_rank(kOp, in.topk_weights, 2);
    check_float(kOp, in.topk_weights);
    Dims d{};
    d.T = in.x.dim(0);
    d.H = in.x.dim(1);
    d.k = in.topk_ids.dim(1);
    check_dim(kOp, in.topk_ids, 0, d.T, "the tokens of x");
    check_dim(kOp, in.topk_weights, 0, d.T, "the tokens of x");
    check_dim(kOp, in.topk_weights, 1, d.k, "topk_ids' experts per token");
    check_rank(kOp, in.w13_q, 3);
    d.E = in.w13_q.dim(0);
    if (d.E <= 0) fail(kOp, in.w13_q, "must hold at least one expert");
    const int64_t two_i = in.w13_q.dim(1);
    if (two_i <= 0 || two_i % (2 * 16) != 0)
        fail(kOp, in.w13_q, "must have 2I rows (gate then up) with I a multiple of 16, got " + std::to_string(two_i));
    d.I = two_i / 2;
    if (d.H % kPanel != 0) fail(kOp, in.x, "needs a hidden size divisible by 32, got " + std::to_string(d.H));
    if (in.tile16) {
        check_qlinear_layout(kOp, true, bits.w13, "w13_bits");
        check_qlinear_layout(kOp, true, bits.w2, "w2_bits");
    }
    d.g13 = check_qweights(kOp, in.w13_q, in.w13_s, in.w13_zp, d.E, 2 * d.I, d.H, bits.w13, in.zero_points_checked);
    d.g2 = check_qweights(kOp, in.w2_q, in.w2_s, in.w2_zp, d.E, d.H, d.I, bits.w2, in.zero_points_checked);
    for (int64_t i = 0; i < d.T * d.k; ++i) {
        const int64_t e = index_at(in.topk_ids, i);
        if (e < 0 || e >= d.E)
            fail(kOp, in.topk_ids, "holds expert id " + std::to_string(e) + " outside [0, " + std::to_string(d.E) +
                                       ") at token " + std::to_string(i / d.k));
    }
    return d;
}

// dst[j] = silu(gate[j]) * up[j] for 16 columns, in vector lanes: the sigmoid from e = exp(-|g|)
// (<= 1, vec_exp.hpp's domain, relative error ~2e-7): 1 / (1 + e) for g >= 0, e / (1 + e) below.
// Scalar std::exp here was ~1.8% of a decode item's time (16 columns of one expert's gate and up
// rows for 1-2 tokens, 3-layer V2-Lite int8 batch 8).
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
inline void silu_mul16(const float* gate, const float* up, float* dst) {
    vf16 g, u;
    std::memcpy(&g, gate, sizeof g);
    std::memcpy(&u, up, sizeof u);
    const vf16 e = exp_neg_lanes<vf16, vi16>(g > 0.f ? -g : g);
    const vf16 sig = (g >= 0.f ? vf16{} + 1.f : e) / (1.f + e);
    const vf16 r = g * sig * u;
    std::memcpy(dst, &r, sizeof r);
}

}  // namespace

std::vector<std::pair<size_t, const char*>> int4_zero_point_inputs(MoeBits bits) {
    std::vector<std::pair<size_t, const char*>> zps;
    if (bits.w13 == 4) zps.emplace_back(5, "w13_zp");
    if (bits.w2 == 4) zps.emplace_back(8, "w2_zp");
    return zps;
}

MoeShapes moe_experts_shapes(const MoeInputs& in, MoeBits bits) {
    const Dims d = check_all(in, bits);
    return MoeShapes{d.T, d.H};
}

void moe_experts(const MoeInputs& in, MoeBits bits, const TensorView& out, const Threading& th, Compute compute) {
    const Dims d = check_all(in, bits);
    if (out.dtype != DType::f32) fail(kOp, out, std::string("must be f32, got ") + dtype_name(out.dtype));
    const QgemmIsa& isa = *kernels().qgemm;
    // Per projection: fp8 codes take bf16 or f32 dots, never int8 activations (qmode_fp8).
    const bool reduced = compute == Compute::bf16;
    const QMode mode13 = bits.w13 == kFp8Bits ? qmode_fp8(reduced, isa) : qmode(reduced, isa);
    const QMode mode2 = bits.w2 == kFp8Bits ? qmode_fp8(reduced, isa) : qmode(reduced, isa);
    const int bi13 = weight_code_index(bits.w13), bi2 = weight_code_index(bits.w2);
    float* y = out.ptr<float>();
    if (d.T == 0) return;
    // Activations and routing weights in f32 (copies only when the runtime passed bf16 or f16).
    std::vector<float> x_f32, w_f32;
    const float* x = in.x.ptr<float>();
    if (in.x.dtype != DType::f32) {
        x_f32.resize(d.T * d.H);
        to_f32(in.x.data, in.x.dtype, x_f32.data(), d.T * d.H);
        x = x_f32.data();
    }
    const float* topk_w = in.topk_weights.ptr<float>();
    if (in.topk_weights.dtype != DType::f32) {
        w_f32.resize(d.T * d.k);
        to_f32(in.topk_weights.data, in.topk_weights.dtype, w_f32.data(), d.T * d.k);
        topk_w = w_f32.data();
    }

    // Routing: pairs (token, slot) grouped by expert, tokens ascending within an expert.
    const int64_t P = d.T * d.k;
    std::vector<int64_t> start(d.E + 1, 0), pair_tok(P), pair_row(P);
    std::vector<float> pair_w(P);
    for (int64_t i = 0; i < P; ++i) ++start[index_at(in.topk_ids, i) + 1];
    for (int64_t e = 0; e < d.E; ++e) start[e + 1] += start[e];
    {
        std::vector<int64_t> fill(start.begin(), start.end() - 1);
        for (int64_t i = 0; i < P; ++i) {
            const int64_t p = fill[index_at(in.topk_ids, i)]++;
            pair_tok[p] = i / d.k;
            pair_w[p] = topk_w[i];
        }
    }
    for (int64_t p = 0; p < P; ++p) pair_row[p] = p;
    std::vector<int64_t> active;
    int64_t max_m = 0, min_m = P;
    for (int64_t e = 0; e < d.E; ++e)
        if (start[e + 1] > start[e]) {
            active.push_back(e);
            max_m = std::max(max_m, start[e + 1] - start[e]);
            min_m = std::min(min_m, start[e + 1] - start[e]);
        }
    const int64_t many13 = many_rows(mode13), many2 = many_rows(mode2);
    const bool some_many = max_m >= std::min(many13, many2);

    const QWeights w13{in.w13_q.ptr<uint8_t>(), in.w13_s.ptr<float>(), in.w13_zp.ptr<uint8_t>(), in.w13_q.dim(2),
                       d.H / d.g13};
    const QWeights w2{in.w2_q.ptr<uint8_t>(), in.w2_s.ptr<float>(), in.w2_zp.ptr<uint8_t>(), in.w2_q.dim(2),
                      d.I / d.g2};

    // Phase 1: act[p, :] = silu(x_p gate^T) * (x_p up^T).
    const QActs xa(x, d.T, d.H, d.g13, mode13, min_m < many13, isa, th);
    std::unique_ptr<float[]> act(new float[P * d.I]);
    const int64_t col_blocks = d.I / 16;
    // Decode (no expert with many tokens): every item costs the same, and contiguous runs of items
    // are contiguous runs of each expert's rows, which the cores' prefetchers stream (split_for).
    const auto spread = some_many ? dynamic_for : split_for;
    const bool t13 = in.tile16 && tile16_runs(isa, bits.w13, mode13, xa);
    // Each expert's pairs in runs of at most kQLinearRowBlock, as MlaQLinear blocks its rows: a run's
    // activation rows stay in L2 while the items of its column blocks go by. Whole, an expert with
    // every token of a 1024-token prefill streamed 2 MB of rows from L3 per 16 columns (V2-Lite's
    // shared MLP run as two experts of this op, int8, Zen 4, 2 threads: 205 GMAC/s; in runs ~260;
    // MlaQLinear on the same weights 370).
    struct Run {
        int64_t e, p0, m;
    };
    std::vector<Run> runs;
    for (int64_t e : active)
        for (int64_t p = start[e]; p < start[e + 1]; p += kQLinearRowBlock)
            runs.push_back(Run{e, p, std::min(kQLinearRowBlock, start[e + 1] - p)});
    spread(th, static_cast<int64_t>(runs.size()) * col_blocks, [&](int64_t item) {
        const Run& run = runs[item / col_blocks];
        const int64_t e = run.e, i0 = (item % col_blocks) * 16, p0 = run.p0, m = run.m;
        const int64_t gate_row = e * 2 * d.I + i0, up_row = gate_row + d.I;
        thread_local std::vector<float> tile;
        if (static_cast<int64_t>(tile.size()) < m * kPanel) tile.resize(m * kPanel);
        float* c = tile.data();
        if (t13) {  // the gate's 16-row tile and the up's (I rows further): gate at c[j], up at c[16 + j]
            const uint8_t* q = w13.q + gate_row * w13.row_bytes;
            const float* s = w13.s + gate_row * w13.groups;
            if (bits.w13 == kFp8Bits)
                qtile16_fp8(isa, xa, pair_tok.data() + p0, m, q, s, w13.groups, d.H, d.g13, c, d.I);
            else
                qtile16(isa, bi13, xa, pair_tok.data() + p0, m, q, s, w13.zp + gate_row * w13.groups, w13.groups, d.H, d.g13, c,
                        d.I, /*paired=*/true);
            for (int64_t t = 0; t < m; ++t)
                silu_mul16(c + t * kPanel, c + t * kPanel + 16, act.get() + (p0 + t) * d.I + i0);
            return;
        }
        // Gate and up blocks interleaved (g0 u0 g1 u1 ...), read two at a time even for 1-2 tokens:
        // the core then streams the expert's gate and up rows side by side instead of 32 KB of one,
        // then 32 KB of the other. Alone at V2-Lite dims (int8, 2 cores, Xeon, 3 alternated
        // processes): 1 token 3.1-3.2 -> 2.4-3.0 ms, 8 tokens 15.4-17.5 -> 12.4-15.5 ms. Column j of
        // the 16 is row j % 4 of block j / 4: gate at c[8 (j / 4) + j % 4], up 4 further.
        QWeights gate = w13, up = w13;
        int64_t g0 = gate_row, u0 = up_row;
        if (in.tile16) {  // a kernel of the 4-row layout: the two tiles rewritten into it first
            thread_local Rows4Scratch gate_rows4, up_rows4;
            gate = rows4_view(w13, gate_row, 16, gate_rows4);
            up = rows4_view(w13, up_row, 16, up_rows4);
            g0 = u0 = 0;
        }
        QBlock blocks[kPanel / 4];
        for (int64_t j = 0; j < 4; ++j) {
            blocks[2 * j] = gate.block(g0 + 4 * j);
            blocks[2 * j + 1] = up.block(u0 + 4 * j);
        }
        qtile(isa, bi13, xa, pair_tok.data() + p0, m, blocks, d.H, d.g13, c, many13, 2);
        for (int64_t t = 0; t < m; ++t) {
            alignas(64) float gate[16], up[16];
            for (int64_t j = 0; j < 16; ++j) {
                gate[j] = c[t * kPanel + 8 * (j / 4) + j % 4];
                up[j] = c[t * kPanel + 8 * (j / 4) + 4 + j % 4];
            }
            silu_mul16(gate, up, act.get() + (p0 + t) * d.I + i0);
        }
    });

    // Phase 2: y[t, cols] = sum over t's pairs, experts ascending, of w_p * (act_p . down rows).
    const QActs aa(act.get(), P, d.I, d.g2, mode2, min_m < many2, isa, th);
    std::fill(y, y + d.T * d.H, 0.f);
    const bool t2 = tile16_runs(isa, bits.w2, mode2, aa);
    const auto down_tile = [&](int64_t item, int64_t e) {  // expert e's share of columns item * 32 ..
        const int64_t c0 = item * kPanel, p0 = start[e], m = start[e + 1] - p0, row = e * d.H + c0;
        thread_local std::vector<float> tile;
        if (static_cast<int64_t>(tile.size()) < m * kPanel) tile.resize(m * kPanel);
        float* c = tile.data();
        qtile_at(isa, bi2, aa, pair_row.data() + p0, m, w2, row, in.tile16, t2, d.I, d.g2, c, many2);
        for (int64_t t = 0; t < m; ++t) {
            float* dst = y + pair_tok[p0 + t] * d.H + c0;
            const float wt = pair_w[p0 + t];
            for (int64_t j = 0; j < kPanel; ++j) dst[j] += wt * c[t * kPanel + j];
        }
    };
    if (some_many) {  // uneven items: each takes its columns through every expert
        dynamic_for(th, d.H / kPanel, [&](int64_t item) {
            for (int64_t e : active) down_tile(item, e);
        });
    } else {
        // Each core takes one run of columns and walks it expert by expert, so it reads one
        // contiguous run of each expert's down rows (~1.4 MB at V2-Lite's dims) instead of a 45 KB
        // piece per expert per item (decode's batch-8 MoE 16.0-16.7 -> 13.4-14.4 ms with the 1-2
        // token prefetch). Each element still sums its experts in ascending order, whatever the split.
        split_ranges(th, d.H / kPanel, [&](int64_t begin, int64_t end) {
            for (int64_t e : active)
                for (int64_t item = begin; item < end; ++item) down_tile(item, e);
        });
    }
}

}  // namespace mla
