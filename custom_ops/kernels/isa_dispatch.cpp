#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "isa.hpp"
#include "mla_kernels.hpp"

namespace mla {

#if !defined(MLA_HAVE_AVX2)
const IsaKernels* isa_avx2() { return nullptr; }
#endif
#if !defined(MLA_HAVE_AVX512)
const IsaKernels* isa_avx512() { return nullptr; }
#endif

namespace {

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return false;
#endif
}

// The tables this build has that this CPU can run, best first.
const IsaKernels* usable(const char* name) {
    if (std::strcmp(name, "avx512") == 0) return cpu_has_avx512() ? isa_avx512() : nullptr;
    if (std::strcmp(name, "avx2") == 0) return cpu_has_avx2() ? isa_avx2() : nullptr;
    if (std::strcmp(name, "generic") == 0) return &isa_generic();
    return nullptr;
}

const IsaKernels& pick() {
    // MLA_EXPORT_ISA=generic|avx2|avx512 forces a table (tests run the portable path; benchmarks
    // compare tables side by side). A table this build or CPU lacks is an error, not a fallback:
    // a benchmark or test that asked for it would otherwise measure something else.
    const char* force = std::getenv("MLA_EXPORT_ISA");
    if (force && *force) {
        if (const IsaKernels* k = usable(force)) return *k;
        throw Error(std::string("MLA_EXPORT_ISA=") + force +
                    ": not one of generic, avx2, avx512 that this build and CPU can run");
    }
    for (const char* name : {"avx512", "avx2"})
        if (const IsaKernels* k = usable(name)) return *k;
    return isa_generic();
}

std::atomic<const IsaKernels*> g_chosen{nullptr};

}  // namespace

const IsaKernels& isa() {
    const IsaKernels* k = g_chosen.load(std::memory_order_acquire);
    if (!k) {
        static const IsaKernels& first = pick();  // once per process (throws on a bad MLA_EXPORT_ISA)
        const IsaKernels* expected = nullptr;
        g_chosen.compare_exchange_strong(expected, &first);
        k = g_chosen.load(std::memory_order_acquire);
    }
    return *k;
}

bool set_isa(const char* name) {
    const IsaKernels* k = usable(name);
    if (!k) return false;
    g_chosen.store(k, std::memory_order_release);
    return true;
}

const char* isa_name() { return isa().name; }

}  // namespace mla
