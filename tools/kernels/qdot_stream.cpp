// How fast the library's 1-2 token integer dots stream their codes, against a plain read of the same
// machine: qdot_q8 (the VNNI table's int8-activation dots, 4-row layout) and qdot_q8_t16 (the same dots on
// 16-row tiles, the layout the runtime writes on VNNI CPUs) over a matrix far larger than
// the L3 (default 101376 x 2048, about an lm_head; 36 V2-Lite experts' gate and up), each thread streaming a contiguous half of the rows as
// split_for hands them out, the cases alternated in one process (this host's speed moves between
// processes), medians. A tool for tuning the decode kernels per CPU; not built by the package.
//
//   cmake --build BUILD   # the package's C++ build (libmla_kernels.a)
//   g++ -O2 -std=c++17 -march=native -Icustom_ops/kernels tools/kernels/qdot_stream.cpp BUILD/libmla_kernels.a \
//       -lpthread -o qdot_stream && ./qdot_stream [rows=101376] [threads=2] [rounds=15]
//
// Needs an AVX-512 VNNI CPU (the table it reads); weights are synthetic codes (speed does not depend
// on their values), in 2 MiB pages where the kernel allows them.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "stream_bench.hpp"

using namespace mla;
using stream_bench::pages;
using stream_bench::plain_read;
using stream_bench::split_timed;

namespace {

struct Weights {
    int64_t rows, K, group, groups, row_bytes;
    uint8_t* q;
    float* s;
    uint8_t* zp;
};

Weights make(int bits, int64_t rows, int64_t K, int64_t group) {
    Weights w{rows, K, group, K / group, K * bits / 8, nullptr, nullptr, nullptr};
    w.q = static_cast<uint8_t*>(pages(rows * w.row_bytes));
    w.s = static_cast<float*>(pages(rows * w.groups * 4));
    w.zp = static_cast<uint8_t*>(pages(rows * w.groups));
    for (int64_t i = 0; i < rows * w.row_bytes; ++i) w.q[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
    for (int64_t i = 0; i < rows * w.groups; ++i) w.s[i] = 0.01f, w.zp[i] = bits == 4 ? 8 : 128;
    return w;
}

QBlock block(const Weights& w, int64_t r0) {
    QBlock b;
    b.q = w.q + r0 * w.row_bytes;
    for (int r = 0; r < 4; ++r) b.s[r] = w.s + (r0 + r) * w.groups, b.zp[r] = w.zp + (r0 + r) * w.groups;
    return b;
}

using Dot = void (*)(int64_t, int64_t, const QRow*, const QBlock*, float*, int64_t);

// One pass over every row: nb 4-row blocks a call, `tokens` activation rows.
double pass(const Weights& w, Dot dot, int nb, const QRow* x, float* out, int threads) {
    return split_timed(w.rows / (4 * nb), threads, [&](int64_t c) {
        QBlock b[2] = {block(w, 4 * nb * c), block(w, 4 * nb * c + (nb - 1) * 4)};
        dot(w.K, w.group, x, b, out + 4 * nb * c, w.rows);
    });
}

using DotT16 = void (*)(int64_t, int64_t, const QRow*, const uint8_t*, const float*, const uint8_t*, int64_t, int64_t,
                        float*, int64_t);

// The same pass over the codes as 16-row tiles (the layout the runtime writes on VNNI CPUs, read
// by qdot_q8_t16: the bytes are synthetic either way), nb tiles side by side a call as the MoE's gate
// and up are read (their factors in tile order: a tile's 16 of group g at 16 * g).
double pass_t16(const Weights& w, DotT16 dot, int nb, const QRow* x, float* out, int threads) {
    return split_timed(w.rows / (16 * nb), threads, [&](int64_t c) {
        const int64_t r0 = 16 * nb * c;
        dot(w.K, w.group, x, w.q + r0 * w.row_bytes, w.s + r0 * w.groups, w.zp + r0 * w.groups, w.groups, 16, out + r0,
            16);
    });
}

// fp8 codes (e4m3 as DeepSeek's FP8 checkpoints ship them, one scale a 128-input block) read by
// qdot_fp8_t16 against bf16 activations (g_bf16), adapted to DotT16 so the passes above run them.
const uint16_t* g_bf16[2];
template <int NB, int M>
void fp8_t16(int64_t K, int64_t group, const QRow*, const uint8_t* q, const float* s, const uint8_t*, int64_t groups,
             int64_t step, float* out, int64_t ldo) {
    qgemm_avx512::kQgemmIsa.qdot_fp8_t16[NB - 1][M - 1](K, group, g_bf16, q, s, groups, step, out, ldo);
}

// An MoE's gate and up as the runtime reads them at 1-2 tokens: experts of 2 x `apart` rows (gate
// rows, then up rows), a call reading gate tile i and up tile i (`apart` rows further) side by side
// (nb2: both in one call, the broadcasts shared) or as two 1-tile calls (nb1) one after the other.
double pass_pairs(const Weights& w, DotT16 nb2, DotT16 nb1, int64_t apart, const QRow* x, float* out, int threads) {
    const int64_t experts = w.rows / (2 * apart), per = apart / 16;
    return split_timed(experts * per, threads, [&](int64_t c) {
        const int64_t r0 = (c / per) * 2 * apart + (c % per) * 16;
        const uint8_t* q = w.q + r0 * w.row_bytes;
        const float* s = w.s + r0 * w.groups;
        const uint8_t* zp = w.zp + r0 * w.groups;
        if (nb2) {
            nb2(w.K, w.group, x, q, s, zp, w.groups, apart, out + r0, 16);
        } else {
            nb1(w.K, w.group, x, q, s, zp, w.groups, 16, out + r0, 16);
            nb1(w.K, w.group, x, q + apart * w.row_bytes, s + apart * w.groups, zp + apart * w.groups, w.groups, 16,
                out + r0 + apart, 16);
        }
    });
}

}  // namespace

int main(int argc, char** argv) {
    const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 101376, K = 2048;
    const int threads = argc > 2 ? std::atoi(argv[2]) : 2, rounds = argc > 3 ? std::atoi(argv[3]) : 15;
    if (rows < 2816 || rows % 2816 || threads < 1 || rounds < 1) {
        std::fprintf(stderr, "usage: qdot_stream [rows (a multiple of 2816: MoE experts of 2 x 1408 rows)] [threads >= 1] [rounds >= 1]\n");
        return 2;
    }
    if (!__builtin_cpu_supports("avx512vnni")) {
        std::fprintf(stderr, "qdot_stream reads the AVX-512 VNNI table: this CPU has no AVX512_VNNI\n");
        return 2;
    }
    const QgemmIsa& isa = qgemm_avx512::kQgemmIsa;
    const Weights w4 = make(4, rows, K, 128), w8 = make(8, rows, K, K), wf8 = make(8, rows, K, 128);
    std::vector<uint16_t> xb(2 * K, 0x3f80);  // bf16 1.0
    g_bf16[0] = xb.data(), g_bf16[1] = xb.data() + K;
    const bool fp8 = isa.qdot_fp8_t16[0][0] != nullptr && __builtin_cpu_supports("avx512vbmi");
    std::vector<int8_t> xq(2 * K);
    for (int64_t i = 0; i < 2 * K; ++i) xq[i] = static_cast<int8_t>((i * 37) % 255 - 127);
    std::vector<float> d(2 * K / 128, 0.01f), gsum4(2 * K / 128, 1.f), gsum8(2, 1.f);
    const QRow x4[2] = {{xq.data(), d.data(), gsum4.data(), 128}, {xq.data() + K, d.data() + K / 128, gsum4.data() + K / 128, 128}};
    const QRow x8[2] = {{xq.data(), d.data(), gsum8.data(), 128}, {xq.data() + K, d.data() + K / 128, gsum8.data() + 1, 128}};
    std::vector<float> out(2 * rows);
    struct Case {
        const char* name;
        const Weights* w;
        Dot dot;
        int nb;  // blocks or tiles a call; 0: an MoE gate / up case (pass_pairs); -1: not run on this CPU
        const QRow* x;
        DotT16 t16 = nullptr;  // a tile16 case: this kernel instead of dot
        DotT16 t16_one = nullptr;  // an MoE gate / up case (pass_pairs): t16 reads both tiles, or this one each
    };
    const Case cases[] = {{"int4 g128, 1 token", &w4, isa.qdot_q8[1][0][0], 1, x4},
                          {"int4 g128, 2 tokens", &w4, isa.qdot_q8[1][0][1], 1, x4},
                          {"int4 g128, 1 token, 2 blocks", &w4, isa.qdot_q8[1][1][0], 2, x4},
                          {"int8, 1 token", &w8, isa.qdot_q8[0][0][0], 1, x8},
                          {"int8, 2 tokens", &w8, isa.qdot_q8[0][0][1], 1, x8},
                          {"tile16 int4 g128, 1 token", &w4, nullptr, 1, x4, isa.qdot_q8_t16[1][0][0]},
                          {"tile16 int4 g128, 2 tokens", &w4, nullptr, 1, x4, isa.qdot_q8_t16[1][0][1]},
                          {"tile16 int8, 1 token", &w8, nullptr, 1, x8, isa.qdot_q8_t16[0][0][0]},
                          {"MoE gate+up int4, 1 token, paired", &w4, nullptr, 0, x4, isa.qdot_q8_t16[1][1][0]},
                          {"MoE gate+up int4, 1 token, apart", &w4, nullptr, 0, x4, nullptr, isa.qdot_q8_t16[1][0][0]},
                          {"MoE gate+up int4, 2 tokens, paired", &w4, nullptr, 0, x4, isa.qdot_q8_t16[1][1][1]},
                          {"tile16 fp8 b128, 1 token", &wf8, nullptr, fp8 ? 1 : -1, x8, fp8_t16<1, 1>},
                          {"MoE gate+up fp8 b128, 1 token, paired", &wf8, nullptr, fp8 ? 0 : -1, x8, fp8_t16<2, 1>},
                          {"MoE gate+up int8, 1 token, paired", &w8, nullptr, 0, x8, isa.qdot_q8_t16[0][1][0]},
                          {"MoE gate+up int8, 1 token, apart", &w8, nullptr, 0, x8, nullptr, isa.qdot_q8_t16[0][0][0]},
                          {"MoE gate+up int8, 2 tokens, paired", &w8, nullptr, 0, x8, isa.qdot_q8_t16[0][1][1]},
                          {"MoE gate+up int8, 2 tokens, apart", &w8, nullptr, 0, x8, nullptr, isa.qdot_q8_t16[0][0][1]}};
    constexpr int kCases = sizeof cases / sizeof cases[0];
    std::vector<std::vector<double>> t(kCases + 1);
    for (int r = 0; r < rounds; ++r) {
        for (int c = 0; c < kCases; ++c)
            t[c].push_back(cases[c].nb < 0 ? 0.
                           : cases[c].nb == 0 ? pass_pairs(*cases[c].w, cases[c].t16, cases[c].t16_one, 1408, cases[c].x, out.data(), threads)
                           : cases[c].t16 ? pass_t16(*cases[c].w, cases[c].t16, cases[c].nb, cases[c].x, out.data(), threads)
                                        : pass(*cases[c].w, cases[c].dot, cases[c].nb, cases[c].x, out.data(), threads));
        t[kCases].push_back(plain_read(w8.q, rows * K, threads));
    }
    std::printf("%lld x %lld, %d threads, %d rounds alternated, medians\n", static_cast<long long>(rows),
                static_cast<long long>(K), threads, rounds);
    const std::vector<double> med = stream_bench::medians(t);
    const double read_gbs = rows * K / med[kCases] / 1e9;
    for (int c = 0; c < kCases; ++c) {
        if (cases[c].nb < 0) {
            std::printf("  %-30s skipped: this CPU has no AVX512_VBMI (the fp8 lookups)\n", cases[c].name);
            continue;
        }
        const double gbs = cases[c].w->rows * cases[c].w->row_bytes / med[c] / 1e9;
        std::printf("  %-30s %7.2f ms  %5.1f GB/s of codes  %.2f of the plain read\n", cases[c].name, med[c] * 1e3, gbs,
                    gbs / read_gbs);
    }
    std::printf("  %-30s %7.2f ms  %5.1f GB/s\n", "plain read", med[kCases] * 1e3, read_gbs);
    return 0;
}
