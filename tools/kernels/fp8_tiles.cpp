// fp8 (e4m3) weight codes' bf16 dots against int8's, the library's own kernels on one matrix far larger
// than the L3 (default 21888 x 2048, a dense MLP's gate and up), each thread streaming a contiguous half
// of the rows as split_for hands them out, the cases alternated in one process (this host's speed moves
// between processes), medians: the 4-row layout's lookups (qdot_fp8_bf16_lut), the tile16 layout's
// (qdot_fp8_t16) and int8 in tile16 (qdot_q8_t16), at 1 and 8 tokens, called as MlaQLinear calls
// them (qmatmul.cpp's qtile, qtile16, qtile16_fp8), and the MoE's gate and up rows at 1 token (two
// streams: int8 reads them side by side, fp8 block by block). A tool for tuning the fp8 kernels per
// CPU; not built by the package.
//
//   cmake --build BUILD   # the package's C++ build (libmla_kernels.a)
//   g++ -O2 -std=c++17 -march=native -Icustom_ops/kernels -o fp8_tiles tools/kernels/fp8_tiles.cpp
//       BUILD/libmla_kernels.a -lpthread && ./fp8_tiles [rows=21888] [threads=2] [rounds=15]
//
// Needs an AVX-512 CPU with VNNI, BF16 and VBMI (the entries it reads); the codes are synthetic
// (speed does not depend on their values; both layouts read the same bytes), in 2 MiB pages.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "stream_bench.hpp"

using namespace mla;
using stream_bench::pages;
using stream_bench::plain_read;
using stream_bench::split_timed;

namespace {

constexpr int64_t K = 2048, kGroup = 128, kGroups = K / kGroup;

// Every 32-row tile of the matrix handed to `tile(first_row)`, the tiles split in contiguous halves.
double pass(int64_t rows, int threads, const std::function<void(int64_t)>& tile) {
    return split_timed(rows / 32, threads, [&](int64_t i) { tile(32 * i); });
}

}  // namespace

int main(int argc, char** argv) {
    const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 21888;
    const int threads = argc > 2 ? std::atoi(argv[2]) : 2, rounds = argc > 3 ? std::atoi(argv[3]) : 15;
    if (rows < 64 || rows % 64 || threads < 1 || rounds < 1) {
        std::fprintf(stderr, "usage: fp8_tiles [rows (a multiple of 64)] [threads >= 1] [rounds >= 1]\n");
        return 2;
    }
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bf16") ||
        !__builtin_cpu_supports("avx512vbmi")) {
        std::fprintf(stderr, "fp8_tiles reads the AVX-512 table's VNNI, BF16 and VBMI entries: this CPU lacks one\n");
        return 2;
    }
    const QgemmIsa& isa = qgemm_avx512::kQgemmIsa;
    uint8_t* q = static_cast<uint8_t*>(pages(rows * K));
    for (int64_t i = 0; i < rows * K; ++i) q[i] = static_cast<uint8_t>(i * 2654435761u >> 13) & 0xF7;  // no NaN code
    float* s = static_cast<float*>(pages(rows * kGroups * 4));
    uint8_t* zp = static_cast<uint8_t*>(pages(rows * kGroups));
    for (int64_t i = 0; i < rows * kGroups; ++i) s[i] = 0.01f, zp[i] = 128;
    constexpr int kTokens = 8;
    std::vector<uint16_t> xb(kTokens * K);
    std::vector<int8_t> xq(kTokens * K);
    for (int64_t i = 0; i < kTokens * K; ++i) xb[i] = 0x3F80 + (i % 64), xq[i] = static_cast<int8_t>((i * 37) % 255 - 127);
    std::vector<float> d(kTokens * K / 128, 0.01f), gsum(kTokens * kGroups, 1.f);
    const uint16_t* xbr[kTokens];
    QRow xqr[kTokens];
    for (int t = 0; t < kTokens; ++t)
        xbr[t] = xb.data() + t * K, xqr[t] = {xq.data() + t * K, d.data() + t * K / 128, gsum.data() + t * kGroups, 128};
    std::vector<float> out(kTokens * rows);
    const auto rows4_block = [&](int64_t r0) {
        QBlock b;
        b.q = q + r0 * K;
        for (int r = 0; r < 4; ++r) b.s[r] = s + (r0 + r) * kGroups, b.zp[r] = zp + (r0 + r) * kGroups;
        return b;
    };
    struct Case {
        const char* name;
        std::function<void(int64_t)> tile;
    };
    const std::vector<Case> cases = {
        {"int8 tile16, 1 token", [&](int64_t r0) {
             for (int b = 0; b < 2; ++b)
                 isa.qdot_q8_t16[0][0][0](K, kGroup, xqr, q + (r0 + 16 * b) * K, s + (r0 + 16 * b) * kGroups,
                                       zp + (r0 + 16 * b) * kGroups, kGroups, 16, out.data() + r0 + 16 * b, rows);
         }},
        {"fp8 4-row lookups, 1 token", [&](int64_t r0) {
             for (int b = 0; b < 8; ++b) isa.qdot_fp8_bf16_lut[0](K, kGroup, xbr, rows4_block(r0 + 4 * b), out.data() + r0 + 4 * b, rows);
         }},
        {"fp8 tile16, 1 token", [&](int64_t r0) {
             for (int b = 0; b < 2; ++b)
                 isa.qdot_fp8_t16[0][0](K, kGroup, xbr, q + (r0 + 16 * b) * K, s + (r0 + 16 * b) * kGroups, kGroups, 16,
                                        out.data() + r0 + 16 * b, rows);
         }},
        // the MoE's gate and up: 4-row blocks of two streams (the matrix's halves), as qtile takes them
        {"int8 gate+up paired, 1 token", [&](int64_t r0) {
             const int64_t half = rows / 2, r = r0 / 2;
             for (int j = 0; j < 4; ++j) {
                 const QBlock b[2] = {rows4_block(r + 4 * j), rows4_block(half + r + 4 * j)};
                 isa.qdot_q8[0][1][0](K, kGroup, xqr, b, out.data() + r0 + 8 * j, rows);
             }
         }},
        {"fp8 gate, up alternating, 1 token", [&](int64_t r0) {
             const int64_t half = rows / 2, r = r0 / 2;
             for (int j = 0; j < 4; ++j) {
                 isa.qdot_fp8_bf16_lut[0](K, kGroup, xbr, rows4_block(r + 4 * j), out.data() + r0 + 8 * j, rows);
                 isa.qdot_fp8_bf16_lut[0](K, kGroup, xbr, rows4_block(half + r + 4 * j), out.data() + r0 + 8 * j + 4, rows);
             }
         }},
        {"int8 tile16, 8 tokens", [&](int64_t r0) {
             for (int t0 = 0; t0 < 8; t0 += 4)
                 isa.qdot_q8_t16[0][1][3](K, kGroup, xqr + t0, q + r0 * K, s + r0 * kGroups, zp + r0 * kGroups, kGroups, 16,
                                       out.data() + t0 * rows + r0, rows);
         }},
        {"fp8 4-row lookups, 8 tokens", [&](int64_t r0) {
             for (int b = 0; b < 8; ++b) isa.qdot_fp8_bf16_lut[7](K, kGroup, xbr, rows4_block(r0 + 4 * b), out.data() + r0 + 4 * b, rows);
         }},
        {"fp8 tile16, 8 tokens", [&](int64_t r0) {
             isa.qdot_fp8_t16[1][7](K, kGroup, xbr, q + r0 * K, s + r0 * kGroups, kGroups, 16, out.data() + r0, rows);
         }},
    };
    const size_t n = cases.size();
    std::vector<std::vector<double>> t(n + 1);
    for (int r = 0; r < rounds; ++r) {
        for (size_t c = 0; c < n; ++c) t[c].push_back(pass(rows, threads, cases[c].tile));
        t[n].push_back(plain_read(q, rows * K, threads));
    }
    std::printf("%lld x %lld, groups of %lld, %d threads, %d rounds alternated, medians\n", static_cast<long long>(rows),
                static_cast<long long>(K), static_cast<long long>(kGroup), threads, rounds);
    const std::vector<double> med = stream_bench::medians(t);
    const double read_gbs = rows * K / med[n] / 1e9;
    for (size_t c = 0; c < n; ++c) {
        const double int8 = med[c < 3 ? 0 : c < 5 ? 3 : 5];  // each group's int8 case
        std::printf("  %-34s %7.3f ms  %5.1f GB/s of codes  %.2fx int8's time\n", cases[c].name, med[c] * 1e3,
                    rows * K / med[c] / 1e9, med[c] / int8);
    }
    std::printf("  %-34s %7.3f ms  %5.1f GB/s\n", "plain read", med[n] * 1e3, read_gbs);
    return 0;
}
