// The decode-time ops of the working tree against another commit's, both in one process, calls
// alternated (this host's speed moves between processes): MlaPagedAttention's decode rows (16
// heads, V2-Lite's dims, bf16 W_UK/W_UV, compute bf16, f16 and bf16 caches), MlaQLinear at 1-2 rows
// (lm_head shapes, and projections cycled through copies so their weights come from memory), and
// an MoE layer (64 experts, top 6, H 2048, I 1408) at 1-2 tokens, int8 and int4 tiles. Prints each
// side's median and the median of the per-round ratios base / cur (above 1: the working tree is
// faster). A tool for judging a kernel change; not built by the package.
//
// One source, three objects: this file with -DAB_SIDE=cur (the working tree's kernels), with
// -DAB_SIDE=base -Dmla=mlb against the baseline's headers (tools/kernels/baseline_lib.sh), and with
// -DAB_MAIN:
//
//   tools/kernels/baseline_lib.sh HEAD~1 BASE && cmake --build BUILD
//   K=custom_ops/kernels; F="-O2 -std=c++17 -march=native"
//   g++ $F -I$K -DAB_SIDE=cur -c tools/kernels/op_ab.cpp -o cur.o
//   g++ $F -IBASE/include -Dmla=mlb -DAB_SIDE=base -c tools/kernels/op_ab.cpp -o base.o
//   g++ $F -I$K -DAB_MAIN -c tools/kernels/op_ab.cpp -o main.o
//   g++ main.o cur.o base.o BUILD/libmla_kernels.a BASE/libbaseline.a -lpthread -o op_ab && ./op_ab [rounds=9] [filter]
//
// Synthetic weights and inputs (speed does not depend on their values); 2 threads on one spinning pool
// (stream_bench.hpp's) shared by both sides.
#include <cstdint>

extern "C" {
typedef void (*AbBody)(void* ctx, int64_t i);
void ab_parallel_for(int64_t n, void* ctx, AbBody body);  // the shared pool (the AB_MAIN object)
}

#if defined(AB_SIDE)
#include <immintrin.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "mla_kernels.hpp"
#include "numeric.hpp"
#include "moe_experts.hpp"
#include "qlinear.hpp"

#define AB_CAT2(a, b) a##_##b
#define AB_CAT(a, b) AB_CAT2(a, b)
#define AB_FN(name) AB_CAT(name, AB_SIDE)

using namespace mla;

namespace {

void body_of(void* ctx, int64_t i) { (*static_cast<const std::function<void(int64_t)>*>(ctx))(i); }

Threading pool_threading() {
    Threading th;
    th.num_threads = 2;
    th.parallel_for = [](int64_t n, const std::function<void(int64_t)>& body) {
        ab_parallel_for(n, const_cast<void*>(static_cast<const void*>(&body)), body_of);
    };
    return th;
}

TensorView view(const char* name, void* p, DType t, std::vector<int64_t> shape) {
    TensorView v;
    v.name = name, v.data = p, v.dtype = t, v.shape = std::move(shape);
    return v;
}

uint8_t* pages(size_t n, uint8_t mask) {  // synthetic codes in 2 MiB pages where the kernel allows
    auto* p = static_cast<uint8_t*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    madvise(p, n, MADV_HUGEPAGE);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 2654435761u >> 13) & mask;
    return p;
}

uint16_t half_of(float f, bool bf16) { return bf16 ? f32_to_bf16(f) : f32_to_f16(f); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// One decode step's attention: `batch` sequences of ctx cached rows (blocks of 16, shuffled).
extern "C" double AB_FN(ab_attention)(int64_t batch, int64_t ctx, int bf16_cache, int calls) {
    constexpr int64_t heads = 16, r = 512, dr = 64, dn = 128, dv = 128, w = r + dr, bs = 16;
    struct Data {
        std::vector<uint16_t> wuk, wuv, qn, qp, cache;
        std::vector<int32_t> table, qsl, lens;
        std::vector<float> out;
    };
    static std::map<std::tuple<int64_t, int64_t, int>, Data> made;
    const int64_t nb = (ctx + bs - 1) / bs;
    Data& d = made[{batch, ctx, bf16_cache}];
    if (d.out.empty()) {
        std::mt19937 rng(1);
        std::normal_distribution<float> nd;
        d.wuk.resize(heads * dn * r), d.wuv.resize(heads * r * dv), d.qn.resize(batch * heads * dn);
        d.qp.resize(batch * heads * dr), d.cache.resize(batch * nb * bs * w), d.table.resize(batch * nb);
        for (auto& v : d.wuk) v = half_of(nd(rng) * 0.088f, true);
        for (auto& v : d.wuv) v = half_of(nd(rng) * 0.044f, true);
        for (auto& v : d.qn) v = half_of(nd(rng), true);
        for (auto& v : d.qp) v = half_of(nd(rng), true);
        for (auto& v : d.cache) v = half_of(nd(rng) * 0.5f, bf16_cache);
        for (int64_t i = 0; i < batch * nb; ++i) d.table[i] = static_cast<int32_t>(i);
        std::shuffle(d.table.begin(), d.table.end(), rng);
        for (int64_t i = 0; i <= batch; ++i) d.qsl.push_back(static_cast<int32_t>(i));
        d.lens.assign(batch, static_cast<int32_t>(ctx));
        d.out.resize(batch * heads * dv);
    }
    static Workspace ws;
    const Threading th = pool_threading();
    // plan_attention points at its views: keep them alive for the calls
    TensorView qn = view("q_nope", d.qn.data(), DType::bf16, {batch, heads, dn});
    TensorView qp = view("q_pe", d.qp.data(), DType::bf16, {batch, heads, dr});
    TensorView kv = view("kv_cache", d.cache.data(), bf16_cache ? DType::bf16 : DType::f16, {batch * nb, bs, w});
    TensorView uk = view("w_uk", d.wuk.data(), DType::bf16, {heads, dn, r});
    TensorView uv = view("w_uv", d.wuv.data(), DType::bf16, {heads, r, dv});
    TensorView qsl = view("query_start_loc", d.qsl.data(), DType::i32, {batch + 1});
    TensorView lens = view("seq_lens", d.lens.data(), DType::i32, {batch});
    TensorView bt = view("block_tables", d.table.data(), DType::i32, {batch, nb});
    TensorView out = view("out", d.out.data(), DType::f32, {batch, heads, dv});
    AttentionPlan plan = plan_attention(qn, qp, kv, uk, uv, qsl, lens, bt, 0.1f, Form::absorbed,
                                        bf16_cache ? KvDtype::bf16 : KvDtype::f16);
    plan.bf16_products = true;
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < calls; ++k) run_attention(plan, out, th, ws);
    return seconds_since(t0) / calls;
}

// MlaQLinear of m rows against `copies` N x K matrices of tile16 codes (per-channel int8, or int4 in
// groups of 128), one after another: with many copies their weights come from memory.
extern "C" double AB_FN(ab_qlinear)(int64_t n, int64_t k, int bits, int64_t m, int copies, int calls) {
    struct Data {
        uint8_t *q, *zp;
        std::vector<float> s, x, y;
    };
    static std::map<std::tuple<int64_t, int64_t, int, int64_t, int>, Data> made;
    const int64_t group = bits == 4 ? 128 : k, groups = k / group, row_bytes = k * bits / 8;
    Data& d = made[{n, k, bits, m, copies}];
    if (d.y.empty()) {
        d.q = pages(copies * n * row_bytes, bits == 4 ? 0x77 : 0xff);
        d.zp = pages(n * groups, 0);
        std::memset(d.zp, bits == 4 ? 8 : 128, n * groups);
        d.s.assign(n * groups, 0.01f), d.x.assign(m * k, 0.5f), d.y.resize(m * n);
    }
    QLinearInputs in;
    in.x = view("x", d.x.data(), DType::f32, {m, k});
    in.w_s = view("w_s", d.s.data(), DType::f32, {n, groups});
    in.w_zp = view("w_zp", d.zp, DType::u8, {n, groups});
    in.zero_points_checked = in.tile16 = true;
    const TensorView out = view("out", d.y.data(), DType::f32, {m, n});
    const Threading th = pool_threading();
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c)
        for (int i = 0; i < copies; ++i) {
            in.w_q = view("w_q", d.q + i * n * row_bytes, DType::u8, {n, row_bytes});
            qlinear(in, bits, out, th, Compute::bf16);
        }
    return seconds_since(t0) / calls / copies;
}

// One MoE layer at V2-Lite's dims (tile16 codes, int8 per channel or int4 in groups of 128) for t
// tokens routed at random, over `layers` copies of its experts one after another (from memory).
extern "C" double AB_FN(ab_moe)(int bits, int64_t t, int layers, int calls) {
    constexpr int64_t E = 64, H = 2048, I = 1408, top = 6;
    const int64_t g13 = bits == 4 ? H / 128 : 1, g2 = bits == 4 ? I / 128 : 1;
    struct Layer {
        uint8_t *q13, *q2, *z13, *z2;
        std::vector<float> s13, s2;
    };
    static std::map<std::pair<int, int>, std::vector<Layer>> made;
    std::vector<Layer>& ls = made[{bits, layers}];
    for (int l = static_cast<int>(ls.size()); l < layers; ++l) {
        Layer x;
        const uint8_t mask = bits == 4 ? 0x77 : 0xff;
        x.q13 = pages(E * 2 * I * H * bits / 8, mask), x.q2 = pages(E * H * I * bits / 8, mask);
        x.z13 = pages(E * 2 * I * g13, 0), x.z2 = pages(E * H * g2, 0);
        std::memset(x.z13, bits == 4 ? 8 : 128, E * 2 * I * g13);
        std::memset(x.z2, bits == 4 ? 8 : 128, E * H * g2);
        x.s13.assign(E * 2 * I * g13, 0.01f), x.s2.assign(E * H * g2, 0.01f);
        ls.push_back(std::move(x));
    }
    std::vector<float> x(t * H, 0.3f), wts(t * top, 0.1f), y(t * H);
    std::vector<int32_t> ids(t * top), experts(E);
    std::mt19937 rng(static_cast<unsigned>(t * 7 + bits));
    const Threading th = pool_threading();
    const TensorView out = view("out", y.data(), DType::f32, {t, H});
    double total = 0;
    for (int c = 0; c < calls; ++c)
        for (Layer& l : ls) {
            for (int64_t i = 0; i < t; ++i) {
                for (int64_t e = 0; e < E; ++e) experts[e] = static_cast<int32_t>(e);
                std::shuffle(experts.begin(), experts.end(), rng);
                std::copy_n(experts.begin(), top, ids.begin() + i * top);
            }
            MoeInputs in;
            in.x = view("x", x.data(), DType::f32, {t, H});
            in.topk_ids = view("topk_ids", ids.data(), DType::i32, {t, top});
            in.topk_weights = view("topk_weights", wts.data(), DType::f32, {t, top});
            in.w13_q = view("w13_q", l.q13, DType::u8, {E, 2 * I, H * bits / 8});
            in.w13_s = view("w13_s", l.s13.data(), DType::f32, {E, 2 * I, g13});
            in.w13_zp = view("w13_zp", l.z13, DType::u8, {E, 2 * I, g13});
            in.w2_q = view("w2_q", l.q2, DType::u8, {E, H, I * bits / 8});
            in.w2_s = view("w2_s", l.s2.data(), DType::f32, {E, H, g2});
            in.w2_zp = view("w2_zp", l.z2, DType::u8, {E, H, g2});
            in.zero_points_checked = in.tile16 = true;
            const auto t0 = std::chrono::steady_clock::now();
            moe_experts(in, MoeBits{bits, bits}, out, th, Compute::bf16);
            total += seconds_since(t0);
        }
    return total / calls / layers;
}
#endif  // AB_SIDE

#if defined(AB_MAIN)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "stream_bench.hpp"

extern "C" {
double ab_attention_cur(int64_t batch, int64_t ctx, int bf16_cache, int calls);
double ab_attention_base(int64_t batch, int64_t ctx, int bf16_cache, int calls);
double ab_qlinear_cur(int64_t n, int64_t k, int bits, int64_t m, int copies, int calls);
double ab_qlinear_base(int64_t n, int64_t k, int bits, int64_t m, int copies, int calls);
double ab_moe_cur(int bits, int64_t t, int layers, int calls);
double ab_moe_base(int bits, int64_t t, int layers, int calls);
}

namespace {
stream_bench::SpinPool* g_pool;  // the caller and one spinning worker, made in main
}  // namespace

extern "C" void ab_parallel_for(int64_t n, void* ctx, AbBody body) {
    g_pool->run(n, [&](int64_t i) { body(ctx, i); });
}

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 9;
    const std::string filter = argc > 2 ? argv[2] : "";
    if (rounds < 1) {
        std::fprintf(stderr, "usage: op_ab [rounds >= 1] [filter: a substring of the case names]\n");
        return 2;
    }
    stream_bench::SpinPool pool(2);
    g_pool = &pool;
    struct Case {
        std::string name;
        std::function<double(bool cur)> run;
    };
    std::vector<Case> cases;
    for (int bf : {0, 1})
        for (int64_t ctx : {1024, 8192})
            cases.push_back({"attention 16 heads, 1 x " + std::to_string(ctx) + (bf ? " bf16" : " f16") + " rows",
                             [=](bool cur) { return (cur ? ab_attention_cur : ab_attention_base)(1, ctx, bf, 20); }});
    cases.push_back({"attention 16 heads, 8 x 1024 f16 rows",
                     [](bool cur) { return (cur ? ab_attention_cur : ab_attention_base)(8, 1024, 0, 10); }});
    struct Q {
        const char* name;
        int64_t n, k;
        int bits;
        int64_t m;
        int copies, calls;
    };
    for (const Q& q : {Q{"qlinear lm_head 102400 x 2048 int8, 1 row", 102400, 2048, 8, 1, 1, 3},
                       Q{"qlinear lm_head 102400 x 2048 int8, 2 rows", 102400, 2048, 8, 2, 1, 3},
                       Q{"qlinear lm_head 102400 x 2048 int4, 1 row", 102400, 2048, 4, 1, 1, 3},
                       Q{"qlinear 129280 x 7168 int8, 1 row", 129280, 7168, 8, 1, 1, 1},
                       Q{"qlinear 2048 x 2048 int8 x 64 copies, 1 row", 2048, 2048, 8, 1, 64, 3},
                       Q{"qlinear 576 x 2048 int8 x 128 copies, 1 row", 576, 2048, 8, 1, 128, 3},
                       Q{"qlinear 2816 x 2048 int4 x 64 copies, 1 row", 2816, 2048, 4, 1, 64, 3}})
        cases.push_back({q.name, [=](bool cur) {
                             return (cur ? ab_qlinear_cur : ab_qlinear_base)(q.n, q.k, q.bits, q.m, q.copies, q.calls);
                         }});
    for (int bits : {8, 4})
        for (int64_t t : {1, 2})
            cases.push_back({"moe layer int" + std::to_string(bits) + ", " + std::to_string(t) + " token(s) x 3 layers",
                             [=](bool cur) { return (cur ? ab_moe_cur : ab_moe_base)(bits, t, 3, 20); }});
    std::printf("base / cur: above 1 the working tree is faster; %d rounds alternated, medians\n", rounds);
    for (const Case& c : cases) {
        if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
        std::vector<double> base, cur, ratio;
        for (int r = 0; r <= rounds; ++r) {  // round 0 warms both up
            const double b = c.run(false), n = c.run(true);
            if (r) base.push_back(b), cur.push_back(n), ratio.push_back(b / n);
        }
        const auto median = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            return v[v.size() / 2];
        };
        std::sort(ratio.begin(), ratio.end());
        std::printf("  %-48s base %9.3f ms  cur %9.3f ms  base/cur %.3f (quartiles %.3f-%.3f)\n", c.name.c_str(),
                    median(base) * 1e3, median(cur) * 1e3, ratio[ratio.size() / 2], ratio[ratio.size() / 4],
                    ratio[3 * ratio.size() / 4]);
    }
    return 0;
}
#endif  // AB_MAIN
