#include "cpu_features.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace mla {
namespace {

#if defined(__x86_64__) || defined(__i386__)
struct Regs {
    unsigned a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(unsigned leaf, unsigned sub) {
    Regs r;
    if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
    return r;
}
unsigned long long xgetbv0() {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (static_cast<unsigned long long>(hi) << 32) | lo;
}
#endif

CpuFeatures probe() {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    const Regs l1 = cpuid(1, 0);
    const bool osxsave = l1.c >> 27 & 1;
    const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    const bool ymm = (xcr0 & 0x6) == 0x6;             // SSE and AVX state saved by the OS
    const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;    // opmask and both zmm halves
    const bool tiles = (xcr0 & 0x60000) == 0x60000;   // XTILECFG and XTILEDATA
    const Regs l7 = cpuid(7, 0), l71 = cpuid(7, 1);
    f.fma = ymm && (l1.c >> 12 & 1);
    f.f16c = ymm && (l1.c >> 29 & 1);
    f.avx2 = ymm && (l7.b >> 5 & 1);
    f.avx512f = zmm && (l7.b >> 16 & 1);
    f.avx512dq = zmm && (l7.b >> 17 & 1);
    f.avx512bw = zmm && (l7.b >> 30 & 1);
    f.avx512vl = zmm && (l7.b >> 31 & 1);
    f.avx512_vnni = zmm && (l7.c >> 11 & 1);
    f.avx512_bf16 = zmm && (l71.a >> 5 & 1);
    f.avx512_vbmi = zmm && (l7.c >> 1 & 1);
    f.amx_tile = tiles && (l7.d >> 24 & 1);
    f.amx_bf16 = f.amx_tile && (l7.d >> 22 & 1);
    f.amx_int8 = f.amx_tile && (l7.d >> 25 & 1);
#endif
    return f;
}

}  // namespace

std::string CpuFeatures::names() const {
    const std::pair<const char*, bool> all[] = {
        {"avx2", avx2}, {"fma", fma}, {"f16c", f16c}, {"avx512f", avx512f}, {"avx512bw", avx512bw},
        {"avx512vl", avx512vl}, {"avx512dq", avx512dq}, {"avx512_vnni", avx512_vnni},
        {"avx512_bf16", avx512_bf16}, {"avx512vbmi", avx512_vbmi}, {"amx_tile", amx_tile}, {"amx_bf16", amx_bf16}, {"amx_int8", amx_int8}};
    std::string s;
    for (const auto& [name, has] : all)
        if (has) s += (s.empty() ? "" : " ") + std::string(name);
    return s;
}

const CpuFeatures& cpu_features() {
    static const CpuFeatures f = probe();
    return f;
}

bool amx_granted() {
#if defined(__x86_64__)
    static const bool granted = [] {
        if (!cpu_features().amx_tile) return false;
        constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return granted;
#else
    return false;
#endif
}

}  // namespace mla
