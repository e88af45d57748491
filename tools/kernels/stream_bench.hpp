// What the streaming tools in tools/kernels share: the library's AVX-512 integer-GEMM table they call,
// a buffer in 2 MiB pages, and a plain read of one (the machine's bandwidth of the moment, for the
// kernels' figures to be read against).
#pragma once

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "qgemm.hpp"

namespace mla::qgemm_avx512 {
extern const QgemmIsa kQgemmIsa;  // the AVX-512 table (qgemm_avx512.cpp), in libmla_kernels.a
}

namespace stream_bench {

inline void* pages(size_t n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        std::fprintf(stderr, "mmap of %zu bytes failed\n", n);
        std::exit(2);
    }
    madvise(p, n, MADV_HUGEPAGE);
    return p;
}

// Seconds for `threads` threads to read n bytes at p, each a contiguous share.
inline double plain_read(const uint8_t* p, size_t n, int threads) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    std::vector<int> sink(threads);
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            __m512i m = _mm512_setzero_si512();
            for (size_t i = n / 64 * t / threads * 64; i < n / 64 * (t + 1) / threads * 64; i += 64)
                m = _mm512_max_epu8(m, _mm512_load_si512(p + i));
            sink[t] = _mm512_reduce_add_epi32(m);
        });
    for (auto& t : ts) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Each case's median of its rounds' times.
inline std::vector<double> medians(std::vector<std::vector<double>> times) {
    std::vector<double> med;
    for (auto& t : times) {
        std::sort(t.begin(), t.end());
        med.push_back(t[t.size() / 2]);
    }
    return med;
}

}  // namespace stream_bench
