#include "amx.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "isa.hpp"

namespace mla {
namespace {

struct Cpu {
    bool bf16 = false, int8 = false;  // the units this process may use
};

Cpu detect() {
    Cpu cpu;
    const char* env = std::getenv("MLA_EXPORT_AMX");
    if (env && std::strcmp(env, "0") == 0) return cpu;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return cpu;
    const bool tile = d >> 24 & 1, amx_bf16 = d >> 22 & 1, amx_int8 = d >> 25 & 1, avx512f = b >> 16 & 1;
    if (!tile || !avx512f) return cpu;
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    const bool avx512_bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 >> 5 & 1);
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) != 0) return cpu;
    cpu.bf16 = amx_bf16 && avx512_bf16;
    cpu.int8 = amx_int8;
    return cpu;
}

const Cpu& cpu() {
    static const Cpu c = detect();
    return c;
}

bool avx512_table() { return std::strcmp(isa().name, "avx512") == 0; }

}  // namespace

bool amx_bf16_usable() { return cpu().bf16 && avx512_table(); }
bool amx_int8_usable() { return cpu().int8 && avx512_table(); }

}  // namespace mla
