// MlaMoeExperts (see moe_experts.hpp): routing into per-expert token lists, then two phases.
//
// Phase 1, gate_up: work items are (expert, 16 intermediate columns); each computes the gate and
// up rows of those columns for the expert's tokens and writes silu(gate) * up into act[pair, :],
// pairs ordered by (expert, token). Phase 2, down: work items are 32 output columns; each walks the
// experts in ascending order and adds weight * (act @ down_e^T) onto its columns of every token,
// so no two items write the same element and each token's sum runs in ascending expert order.
// Both phases use one tile routine: few tokens -> dot products on the codes (one pass over the
// weights, which is all decode needs); many tokens -> dequantise a panel of rows once per k-block
// and run dot products of every token against it, in f32 or (compute = bf16, the runtime's bf16
// hint) in bf16 operands with f32 sums.
#include "moe_experts.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "mla_kernels.hpp"  // isa_name()
#include "moe_isa.hpp"
#include "numeric.hpp"
#include "validate.hpp"

namespace mla {

namespace moe_generic { extern const MoeIsa kMoeIsa; }
#if defined(MLA_HAVE_AVX2)
namespace moe_avx2 { extern const MoeIsa kMoeIsa; }
#endif
#if defined(MLA_HAVE_AVX512)
namespace moe_avx512 { extern const MoeIsa kMoeIsa; }
#endif

namespace {

constexpr const char* kOp = "MlaMoeExperts";
constexpr int64_t kPanel = 32;        // weight rows per tile (phase 1: 16 gate + 16 up rows)
constexpr int64_t kManyTokens = 8;    // from this many tokens an expert's panel is dequantised once
constexpr int64_t kBlockK = 2048;     // inputs per dequantised k-block (32 rows x 2048 f32 = 256 KiB, in L2)

// The table of the same name as the attention kernels' (isa_dispatch.cpp: the widest this build
// and CPU run, or the one MLA_EXPORT_ISA forces, with its error for one they lack): one choice
// per process for every op.
const MoeIsa& pick_isa() {
    const std::string name = isa_name();
#if defined(MLA_HAVE_AVX512)
    if (name == "avx512") return moe_avx512::kMoeIsa;
#endif
#if defined(MLA_HAVE_AVX2)
    if (name == "avx2" || name == "avx512") return moe_avx2::kMoeIsa;
#endif
    return moe_generic::kMoeIsa;
}

void check_u8(const TensorView& t, int64_t rank) {
    check_rank(kOp, t, rank);
    if (t.dtype != DType::u8) fail(kOp, t, std::string("must be u8, got ") + dtype_name(t.dtype));
}
void check_f32(const TensorView& t, int64_t rank) {
    check_rank(kOp, t, rank);
    if (t.dtype != DType::f32) fail(kOp, t, std::string("must be f32, got ") + dtype_name(t.dtype));
}

// int4 zero points must be codes (<= 15). They are constants of the graph: each array is checked
// once (by address and size), not on every call, where the scan would cost as much as decode.
void check_int4_zero_points(const TensorView& zp) {
    static std::mutex mutex;
    static std::set<std::pair<const void*, int64_t>> checked;
    const int64_t n = zp.numel();
    const auto key = std::make_pair(static_cast<const void*>(zp.data), n);
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (checked.count(key)) return;
    }
    const uint8_t* z = zp.ptr<uint8_t>();
    for (int64_t i = 0; i < n; ++i)
        if (z[i] > 15) fail(kOp, zp, "holds a zero point above 15 for int4 codes (" + std::to_string(z[i]) + ")");
    std::lock_guard<std::mutex> lock(mutex);
    checked.insert(key);
}

// One projection's codes/scales/zero points: [E, rows, in / per_byte], [E, rows, G], [E, rows, G].
// Returns the group size.
int64_t check_weights(const TensorView& q, const TensorView& s, const TensorView& zp, int64_t experts, int64_t rows,
                      int64_t in, int64_t bits) {
    check_u8(q, 3);
    check_f32(s, 3);
    check_u8(zp, 3);
    const int64_t per_byte = bits == 4 ? 2 : 1;
    check_dim(kOp, q, 0, experts, "the number of experts");
    check_dim(kOp, q, 1, rows, "the projection's output rows");
    if (in % 32 != 0) fail(kOp, q, "needs an input size divisible by 32, got " + std::to_string(in));
    check_dim(kOp, q, 2, in / per_byte, bits == 4 ? "the input size / 2 (two int4 codes per byte)" : "the input size");
    for (const TensorView* t : {&s, &zp}) {
        check_dim(kOp, *t, 0, experts, "the number of experts");
        check_dim(kOp, *t, 1, rows, "the projection's output rows");
    }
    const int64_t groups = s.dim(2);
    if (groups <= 0 || in % groups != 0 || (in / groups) % 32 != 0)
        fail(kOp, s, "must have a group count G with input size / G a multiple of 32 (input size " +
                         std::to_string(in) + ", G " + std::to_string(groups) + ")");
    check_dim(kOp, zp, 2, groups, "the scales' group count");
    if (bits == 4) check_int4_zero_points(zp);
    return in / groups;
}

struct Dims {
    int64_t T, H, k, E, I, g13, g2;
};

Dims check_all(const MoeInputs& in, MoeBits bits) {
    for (auto [name, b] : {std::make_pair("w13_bits", bits.w13), std::make_pair("w2_bits", bits.w2)})
        if (b != 4 && b != 8)
            throw Error(std::string(kOp) + ": attribute '" + name + "' must be 4 or 8, got " + std::to_string(b));
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
    d.g13 = check_weights(in.w13_q, in.w13_s, in.w13_zp, d.E, 2 * d.I, d.H, bits.w13);
    d.g2 = check_weights(in.w2_q, in.w2_s, in.w2_zp, d.E, d.H, d.I, bits.w2);
    for (int64_t i = 0; i < d.T * d.k; ++i) {
        const int64_t e = index_at(in.topk_ids, i);
        if (e < 0 || e >= d.E)
            fail(kOp, in.topk_ids, "holds expert id " + std::to_string(e) + " outside [0, " + std::to_string(d.E) +
                                       ") at token " + std::to_string(i / d.k));
    }
    return d;
}

// One projection's rows of one expert.
struct Proj {
    const uint8_t* q;
    const float* s;
    const uint8_t* zp;
    int64_t row_bytes, groups;
    // Rows r0..r0+3 (r0 % 4 == 0) of expert e, of a projection with `rows` rows.
    QBlock block(int64_t e, int64_t rows, int64_t r0) const {
        const int64_t i = e * rows + r0;
        QBlock b;
        b.q = q + i * row_bytes;  // blocks of 4 interleaved rows: the block starts at its first row's offset
        for (int r = 0; r < 4; ++r) {
            b.s[r] = s + (i + r) * groups;
            b.zp[r] = zp + (i + r) * groups;
        }
        return b;
    }
};

struct Scratch {
    std::vector<float> tile, panel;
    std::vector<uint16_t> panel16;
    std::vector<const float*> a, xs;
    std::vector<const uint16_t*> a16;
};
thread_local Scratch tls;

// c[t * 32 + r] = a[t] . w_r for the m rows a[t] (length K) and the 32 rows w_r. a16: the same
// rows in bf16 when the many-token products run in bf16 (else null).
void tile(const MoeIsa& isa, int bi, int64_t m, const float* const* a, const float* const* asum,
          const uint16_t* const* a16, const QBlock* blocks, int64_t K, int64_t group, float* c) {
    if (m < kManyTokens) {
        // rows outside, tokens inside: a second chunk of tokens finds the 4 rows' codes in cache
        for (int64_t r0 = 0; r0 < kPanel; r0 += 4)
            for (int64_t t0 = 0; t0 < m; t0 += 4) {
                const int64_t mt = std::min<int64_t>(4, m - t0);
                isa.qdot[bi][mt - 1](K, group, a + t0, asum + t0, blocks[r0 / 4], c + t0 * kPanel + r0, kPanel);
            }
        return;
    }
    std::fill(c, c + m * kPanel, 0.f);
    const int64_t kb_max = std::min<int64_t>(K, kBlockK);
    if (static_cast<int64_t>(tls.panel.size()) < kPanel * kb_max) tls.panel.resize(kPanel * kb_max);
    if (a16 && static_cast<int64_t>(tls.panel16.size()) < kPanel * kb_max) tls.panel16.resize(kPanel * kb_max);
    float* w = tls.panel.data();
    for (int64_t k0 = 0; k0 < K; k0 += kb_max) {
        const int64_t kb = std::min(kb_max, K - k0);
        isa.dequant[bi](kPanel / 4, blocks, k0, kb, group, w);
        if (a16) {
            uint16_t* w16 = tls.panel16.data();
            isa.to_bf16(kPanel * kb, w, w16);
            for (int64_t t0 = 0; t0 < m; t0 += 4) {
                const int64_t mt = std::min<int64_t>(4, m - t0);
                for (int64_t r0 = 0; r0 < kPanel; r0 += 4)
                    isa.fdot_bf16[mt - 1](k0, kb, a16 + t0, w16 + r0 * kb, c + t0 * kPanel + r0, kPanel);
            }
            continue;
        }
        for (int64_t t0 = 0; t0 < m; t0 += 4) {
            const int64_t mt = std::min<int64_t>(4, m - t0);
            for (int64_t r0 = 0; r0 < kPanel; r0 += 4)
                isa.fdot[mt - 1](k0, kb, a + t0, w + r0 * kb, c + t0 * kPanel + r0, kPanel);
        }
    }
}

// Rows [n, K] in bf16 for the many-token products (empty when they run in f32).
std::vector<uint16_t> bf16_rows(const MoeIsa& isa, bool on, const float* x, int64_t n, int64_t K) {
    std::vector<uint16_t> out;
    if (!on) return out;
    out.resize(n * K);
    isa.to_bf16(n * K, x, out.data());
    return out;
}

// Sums of each row of x [n, K] over groups of `group`: sums[i * (K / group) + g].
void group_sums(const float* x, int64_t n, int64_t K, int64_t group, float* sums) {
    const int64_t G = K / group;
    for (int64_t i = 0; i < n; ++i)
        for (int64_t g = 0; g < G; ++g) {
            float s = 0.f;
            const float* p = x + i * K + g * group;
            for (int64_t j = 0; j < group; ++j) s += p[j];
            sums[i * G + g] = s;
        }
}

inline float silu(float v) { return v / (1.f + std::exp(-v)); }

}  // namespace

const MoeIsa& moe_isa() {
    static const MoeIsa& isa = pick_isa();
    return isa;
}

const char* moe_isa_name() { return moe_isa().name; }

MoeCompute moe_compute_from_name(const std::string& name) {
    if (name == "f32" || name.empty()) return MoeCompute::f32;
    if (name == "bf16") return MoeCompute::bf16;
    throw Error(std::string(kOp) + ": attribute 'compute' must be f32 or bf16, got '" + name + "'");
}

MoeShapes moe_experts_shapes(const MoeInputs& in, MoeBits bits) {
    const Dims d = check_all(in, bits);
    return MoeShapes{d.T, d.H};
}

void moe_experts(const MoeInputs& in, MoeBits bits, const TensorView& out, const Threading& th, MoeCompute compute) {
    const Dims d = check_all(in, bits);
    if (out.dtype != DType::f32) fail(kOp, out, std::string("must be f32, got ") + dtype_name(out.dtype));
    const MoeIsa& isa = moe_isa();
    static const bool cpu_bf16 = __builtin_cpu_supports("avx512bf16");
    const bool use_bf16 = compute == MoeCompute::bf16 && isa.to_bf16 != nullptr && cpu_bf16;
    const int bi13 = bits.w13 == 4 ? 1 : 0, bi2 = bits.w2 == 4 ? 1 : 0;
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
    std::vector<int64_t> start(d.E + 1, 0), pair_tok(P);
    std::vector<float> pair_w(P);
    for (int64_t i = 0; i < P; ++i) ++start[index_at(in.topk_ids, i) + 1];
    for (int64_t e = 0; e < d.E; ++e) start[e + 1] += start[e];
    {
        std::vector<int64_t> fill(start.begin(), start.end() - 1);
        const float* w = topk_w;
        for (int64_t i = 0; i < P; ++i) {
            const int64_t p = fill[index_at(in.topk_ids, i)]++;
            pair_tok[p] = i / d.k;
            pair_w[p] = w[i];
        }
    }
    std::vector<int64_t> active;
    for (int64_t e = 0; e < d.E; ++e)
        if (start[e + 1] > start[e]) active.push_back(e);

    const Proj w13{in.w13_q.ptr<uint8_t>(), in.w13_s.ptr<float>(), in.w13_zp.ptr<uint8_t>(), in.w13_q.dim(2),
                   d.H / d.g13};
    const Proj w2{in.w2_q.ptr<uint8_t>(), in.w2_s.ptr<float>(), in.w2_zp.ptr<uint8_t>(), in.w2_q.dim(2), d.I / d.g2};

    // Phase 1: act[p, :] = silu(x_p gate^T) * (x_p up^T).
    const int64_t G13 = d.H / d.g13, G2 = d.I / d.g2;
    std::unique_ptr<float[]> xsum(new float[d.T * G13]);
    group_sums(x, d.T, d.H, d.g13, xsum.get());
    std::unique_ptr<float[]> act(new float[P * d.I]);
    int64_t max_m = 0;
    for (int64_t e : active) max_m = std::max(max_m, start[e + 1] - start[e]);
    const std::vector<uint16_t> x16 = bf16_rows(isa, use_bf16 && max_m >= kManyTokens, x, d.T, d.H);
    const int64_t col_blocks = d.I / 16;
    dynamic_for(th, static_cast<int64_t>(active.size()) * col_blocks, [&](int64_t item) {
        const int64_t e = active[item / col_blocks], i0 = (item % col_blocks) * 16;
        const int64_t p0 = start[e], m = start[e + 1] - p0;
        Scratch& s = tls;
        s.a.resize(m);
        s.xs.resize(m);
        s.a16.resize(m);
        for (int64_t t = 0; t < m; ++t) {
            s.a[t] = x + pair_tok[p0 + t] * d.H;
            s.xs[t] = xsum.get() + pair_tok[p0 + t] * G13;
            if (!x16.empty()) s.a16[t] = x16.data() + pair_tok[p0 + t] * d.H;
        }
        QBlock blocks[kPanel / 4];
        for (int64_t j = 0; j < 4; ++j) {
            blocks[j] = w13.block(e, 2 * d.I, i0 + 4 * j);
            blocks[4 + j] = w13.block(e, 2 * d.I, d.I + i0 + 4 * j);
        }
        if (static_cast<int64_t>(s.tile.size()) < m * kPanel) s.tile.resize(m * kPanel);
        float* c = s.tile.data();
        tile(isa, bi13, m, s.a.data(), s.xs.data(), x16.empty() ? nullptr : s.a16.data(), blocks, d.H, d.g13, c);
        for (int64_t t = 0; t < m; ++t) {
            float* dst = act.get() + (p0 + t) * d.I + i0;
            for (int64_t j = 0; j < 16; ++j) dst[j] = silu(c[t * kPanel + j]) * c[t * kPanel + 16 + j];
        }
    });

    // Phase 2: y[t, cols] = sum over t's pairs, experts ascending, of w_p * (act_p . down rows).
    std::unique_ptr<float[]> asum(new float[P * G2]);
    group_sums(act.get(), P, d.I, d.g2, asum.get());
    const std::vector<uint16_t> act16 = bf16_rows(isa, !x16.empty(), act.get(), P, d.I);
    std::fill(y, y + d.T * d.H, 0.f);
    dynamic_for(th, d.H / kPanel, [&](int64_t item) {
        const int64_t c0 = item * kPanel;
        Scratch& s = tls;
        for (int64_t e : active) {
            const int64_t p0 = start[e], m = start[e + 1] - p0;
            s.a.resize(m);
            s.xs.resize(m);
            s.a16.resize(m);
            for (int64_t t = 0; t < m; ++t) {
                s.a[t] = act.get() + (p0 + t) * d.I;
                s.xs[t] = asum.get() + (p0 + t) * G2;
                if (!act16.empty()) s.a16[t] = act16.data() + (p0 + t) * d.I;
            }
            QBlock blocks[kPanel / 4];
            for (int64_t j = 0; j < kPanel / 4; ++j) blocks[j] = w2.block(e, d.H, c0 + 4 * j);
            if (static_cast<int64_t>(s.tile.size()) < m * kPanel) s.tile.resize(m * kPanel);
            float* c = s.tile.data();
            tile(isa, bi2, m, s.a.data(), s.xs.data(), act16.empty() ? nullptr : s.a16.data(), blocks, d.I, d.g2, c);
            for (int64_t t = 0; t < m; ++t) {
                float* dst = y + pair_tok[p0 + t] * d.H + c0;
                const float wt = pair_w[p0 + t];
                for (int64_t j = 0; j < kPanel; ++j) dst[j] += wt * c[t * kPanel + j];
            }
        }
    });
}

}  // namespace mla
