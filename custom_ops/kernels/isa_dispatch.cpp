#include <cstdlib>
#include <cstring>

#include "isa.hpp"
#include "mla_kernels.hpp"

namespace mla {

#if !defined(MLA_HAVE_AVX2)
const IsaKernels* isa_avx2() { return nullptr; }
#endif

static const IsaKernels& pick() {
    // MLA_EXPORT_ISA=generic forces the portable path (tests run both).
    const char* force = std::getenv("MLA_EXPORT_ISA");
    if (force && std::strcmp(force, "generic") == 0) return isa_generic();
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (isa_avx2() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return *isa_avx2();
#endif
    return isa_generic();
}

const IsaKernels& isa() {
    static const IsaKernels& chosen = pick();
    return chosen;
}

const char* isa_name() { return isa().name; }

}  // namespace mla
