// How fast the absorbed attention's bf16 up-projections of one decode token stream their weights, against
// a plain read: the library's gemm_bf16b (the configured ISA table, as latent_attention.cpp calls it) on
// one row of a head's W_UK [128 x 512] and W_UV [512 x 128] (DeepSeek's dims), 16 heads a layer and 16
// layers in turn (64 MiB: every layer's weights come from memory, as in a model's step), 2 threads each
// taking 8 heads of every layer, the cases alternated in one process, medians. A tool for tuning the
// decode kernels per CPU; not built by the package.
//
//   cmake --build BUILD   # the package's C++ build (libmla_kernels.a)
//   g++ -O2 -std=c++17 -march=native -Icustom_ops/kernels tools/kernels/up_stream.cpp BUILD/libmla_kernels.a \
//       -lpthread -o up_stream && ./up_stream [rounds=15]
//
// Needs an AVX-512 CPU (stream_bench.hpp's plain read); the weights are synthetic bf16 values.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "kernel_config.hpp"
#include "stream_bench.hpp"

using namespace mla;

namespace {

constexpr int64_t kLayers = 16, kHeads = 16, kDn = 128, kR = 512, kDv = 128;
constexpr int64_t kHeadElems = kDn * kR + kR * kDv;  // a head's W_UK then its W_UV

double up_projections(const uint16_t* w, int threads) {
    const IsaKernels& K = isa();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            std::vector<float> q(kDn, 0.5f), lat(kR, 0.25f), q_lat(kR), o(kDv);
            for (int64_t l = 0; l < kLayers; ++l)
                for (int64_t h = kHeads * t / threads; h < kHeads * (t + 1) / threads; ++h) {
                    const uint16_t* head = w + (l * kHeads + h) * kHeadElems;
                    K.gemm_bf16b(1, kR, kDn, q.data(), kDn, head, kR, q_lat.data(), kR, false);          // q . W_UK
                    K.gemm_bf16b(1, kDv, kR, lat.data(), kR, head + kDn * kR, kDv, o.data(), kDv, false);  // o_lat . W_UV
                }
        });
    for (auto& t : ts) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 15, threads = 2;
    if (rounds < 1) {
        std::fprintf(stderr, "usage: up_stream [rounds >= 1]\n");
        return 2;
    }
    const size_t bytes = kLayers * kHeads * kHeadElems * 2;
    uint16_t* w = static_cast<uint16_t*>(stream_bench::pages(bytes));
    for (size_t i = 0; i < bytes / 2; ++i) w[i] = static_cast<uint16_t>(0x3F80 + (i & 63));  // 1.0 .. 1.49
    std::vector<std::vector<double>> t(2);
    for (int r = 0; r < rounds; ++r) {
        t[0].push_back(up_projections(w, threads));
        t[1].push_back(stream_bench::plain_read(reinterpret_cast<const uint8_t*>(w), bytes, threads));
    }
    const std::vector<double> med = stream_bench::medians(t);
    std::printf("%s table, %lld layers x %lld heads of bf16 W_UK + W_UV (%.0f MiB), %d threads, %d rounds alternated, medians\n",
                isa().name, static_cast<long long>(kLayers), static_cast<long long>(kHeads), bytes / 1048576.0, threads, rounds);
    std::printf("  up-projections, 1 row  %7.3f ms  %5.1f GB/s  %.2f of the plain read\n", med[0] * 1e3, bytes / med[0] / 1e9,
                med[1] / med[0]);
    std::printf("  plain read             %7.3f ms  %5.1f GB/s\n", med[1] * 1e3, bytes / med[1] / 1e9);
    return 0;
}
