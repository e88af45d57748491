// The decode attention op alone (MlaPagedAttention, one new token, the absorbed form with the
// model's real up-projections) at DeepSeek-V2-Lite's dims (16 heads, r 512, rope 64, nope 128,
// v 128, bf16 W_UK / W_UV, block size 16, blocks shuffled), compute "bf16" as the runtime's bf16
// hint sets it, over an f16 and a bf16 cache, at several context lengths: cases alternated in one
// process (this host's speed moves between processes), medians, and the attention's products as a
// rate. A tool for tuning the decode kernels per CPU; not built by the package.
//
//   cmake --build BUILD   # the package's C++ build (libmla_kernels.a)
//   g++ -O2 -std=c++17 -march=native -Icustom_ops/kernels tools/kernels/attn_decode.cpp BUILD/libmla_kernels.a \
//       -lpthread -o attn_decode && ./attn_decode [heads=16] [threads=2] [rounds=15] [contexts=1024,8192,32768]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "mla_kernels.hpp"
#include "numeric.hpp"
#include "stream_bench.hpp"

using namespace mla;

namespace {

uint16_t to_half(float f, bool bf16) { return bf16 ? f32_to_bf16(f) : f32_to_f16(f); }

struct Case {
    int64_t ctx;
    bool bf16_cache;
    std::vector<uint16_t> cache;
    std::vector<int32_t> table;
    TensorView kv, bt;
};

}  // namespace

int main(int argc, char** argv) {
    const int64_t heads = argc > 1 ? std::atoll(argv[1]) : 16;
    const int threads = argc > 2 ? std::atoi(argv[2]) : 2, rounds = argc > 3 ? std::atoi(argv[3]) : 15;
    std::vector<int64_t> ctxs;
    for (const char* p = argc > 4 ? argv[4] : "1024,8192,32768"; *p;) {
        ctxs.push_back(std::atoll(p));
        while (*p && *p != ',') ++p;
        if (*p) ++p;
    }
    constexpr int64_t r = 512, dr = 64, dn = 128, dv = 128, w = r + dr, bs = 16;
    std::mt19937 rng(0);
    std::normal_distribution<float> nd;
    std::vector<uint16_t> wuk(heads * dn * r), wuv(heads * r * dv), qn(heads * dn), qp(heads * dr);
    for (auto& v : wuk) v = to_half(nd(rng) * 0.088f, true);
    for (auto& v : wuv) v = to_half(nd(rng) * 0.044f, true);
    for (auto& v : qn) v = to_half(nd(rng), true);
    for (auto& v : qp) v = to_half(nd(rng), true);
    std::vector<float> out(heads * dv);
    const auto view = [](const char* name, void* p, DType t, std::vector<int64_t> s) {
        TensorView v;
        v.name = name, v.data = p, v.dtype = t, v.shape = std::move(s);
        return v;
    };
    TensorView vqn = view("q_nope", qn.data(), DType::bf16, {1, heads, dn});
    TensorView vqp = view("q_pe", qp.data(), DType::bf16, {1, heads, dr});
    TensorView vuk = view("w_uk", wuk.data(), DType::bf16, {heads, dn, r});
    TensorView vuv = view("w_uv", wuv.data(), DType::bf16, {heads, r, dv});
    int32_t qsl_v[2] = {0, 1};
    TensorView qsl = view("query_start_loc", qsl_v, DType::i32, {2});
    TensorView vout = view("out", out.data(), DType::f32, {1, heads, dv});

    std::vector<Case> cases;
    std::vector<int32_t> lens;
    for (int64_t ctx : ctxs)
        for (bool bf : {false, true}) {
            Case c;
            c.ctx = ctx, c.bf16_cache = bf;
            const int64_t nb = (ctx + bs - 1) / bs;
            c.cache.resize(nb * bs * w);
            for (auto& v : c.cache) v = to_half(nd(rng) * 0.5f, bf);
            c.table.resize(nb);
            for (int64_t i = 0; i < nb; ++i) c.table[i] = static_cast<int32_t>(i);
            std::shuffle(c.table.begin(), c.table.end(), rng);
            cases.push_back(std::move(c));
        }
    for (auto& c : cases) {
        c.kv = view("kv_cache", c.cache.data(), c.bf16_cache ? DType::bf16 : DType::f16,
                    {static_cast<int64_t>(c.table.size()), bs, w});
        c.bt = view("block_tables", c.table.data(), DType::i32, {1, static_cast<int64_t>(c.table.size())});
        lens.push_back(static_cast<int32_t>(c.ctx));
    }
    stream_bench::SpinPool pool(threads);
    Threading th;
    th.num_threads = threads;
    th.parallel_for = [&](int64_t n, const std::function<void(int64_t)>& body) { pool.run(n, body); };
    Workspace ws;
    const int calls = 20;
    std::vector<std::vector<double>> t(cases.size());
    for (int round = 0; round < rounds + 1; ++round)
        for (size_t i = 0; i < cases.size(); ++i) {
            Case& c = cases[i];
            TensorView sl = view("seq_lens", &lens[i], DType::i32, {1});
            AttentionPlan plan = plan_attention(vqn, vqp, c.kv, vuk, vuv, qsl, sl, c.bt, 0.1f, Form::absorbed,
                                                c.bf16_cache ? KvDtype::bf16 : KvDtype::f16);
            plan.bf16_products = true;
            const auto t0 = std::chrono::steady_clock::now();
            for (int k = 0; k < calls; ++k) run_attention(plan, vout, th, ws);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
            if (round) t[i].push_back(s);  // round 0 warms up
        }
    std::printf("decode attention, %lld heads, %d threads, %d rounds alternated, medians of %d calls\n",
                static_cast<long long>(heads), threads, rounds, calls);
    for (size_t i = 0; i < cases.size(); ++i) {
        std::sort(t[i].begin(), t[i].end());
        const double med = t[i][t[i].size() / 2];
        const double macs = double(heads) * cases[i].ctx * (w + r);
        std::printf("ctx %6lld %s cache: %8.1f us (p25 %8.1f)  attention %6.1f GMAC/s\n",
                    static_cast<long long>(cases[i].ctx), cases[i].bf16_cache ? "bf16" : " f16", med * 1e6,
                    t[i][t[i].size() / 4] * 1e6, macs / med * 1e-9);
    }
    return 0;
}
