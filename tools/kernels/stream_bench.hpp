// What the tools in tools/kernels share: the library's AVX-512 integer-GEMM table they call, a buffer
// in 2 MiB pages, a plain read of one (the machine's bandwidth of the moment, for the kernels'
// figures to be read against), a timed split of work over threads, and a spinning thread pool.
#pragma once

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
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

// Seconds for `threads` threads to run body(i) for every i in [0, items), each thread a contiguous
// share of the indices (as the runtime's split_for hands decode work to the cores).
template <class Body>
double split_timed(int64_t items, int threads, const Body& body) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            for (int64_t i = items * t / threads; i < items * (t + 1) / threads; ++i) body(i);
        });
    for (auto& t : ts) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// n threads (the caller and n - 1 spinning workers) running body(i) for i in [0, count), each taking
// the next index from a shared counter: an op's parallel-for runs many times a call, and a thread
// started a call would cost more than a short task.
class SpinPool {
public:
    explicit SpinPool(int n) : n_(n) {
        for (int t = 1; t < n; ++t) ts_.emplace_back([this] { work(); });
    }
    ~SpinPool() {
        stop_ = true;
        gen_.fetch_add(1);
        for (auto& t : ts_) t.join();
    }
    void run(int64_t n, const std::function<void(int64_t)>& body) {
        body_ = &body, count_ = n, next_.store(0), done_.store(0);
        gen_.fetch_add(1, std::memory_order_release);
        drain();
        while (done_.load(std::memory_order_acquire) != n_ - 1) _mm_pause();
    }

private:
    void drain() {
        for (int64_t i; (i = next_.fetch_add(1)) < count_;) (*body_)(i);
    }
    void work() {
        uint64_t seen = 0;
        for (;;) {
            uint64_t g;
            while ((g = gen_.load(std::memory_order_acquire)) == seen) _mm_pause();
            seen = g;
            if (stop_) return;
            drain();
            done_.fetch_add(1, std::memory_order_release);
        }
    }
    int n_;
    std::vector<std::thread> ts_;
    std::atomic<uint64_t> gen_{0};
    std::atomic<int64_t> next_{0}, done_{0};
    const std::function<void(int64_t)>* body_ = nullptr;
    int64_t count_ = 0;
    std::atomic<bool> stop_{false};
};

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
