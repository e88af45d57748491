// The switchboard (see kernel_config.hpp): parse a setting, check it against this build and CPU,
// resolve what it leaves to auto, publish it through one atomic pointer.
#include "kernel_config.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <string>

#include "cpu_features.hpp"
#include "mla_tensor.hpp"

namespace mla {

#if !defined(MLA_HAVE_AVX2)
const IsaKernels* isa_avx2() { return nullptr; }
#endif
#if !defined(MLA_HAVE_AVX512)
const IsaKernels* isa_avx512() { return nullptr; }
#endif

namespace qgemm_generic { extern const QgemmIsa kQgemmIsa; }
#if defined(MLA_HAVE_AVX2)
namespace qgemm_avx2 { extern const QgemmIsa kQgemmIsa; }
#endif
#if defined(MLA_HAVE_AVX512)
namespace qgemm_avx512 { extern const QgemmIsa kQgemmIsa; }
#endif

namespace {

constexpr const char* kVariable = "MLA_EXPORT_KERNELS";

struct Tables {
    const IsaKernels* f32;
    const QgemmIsa* qgemm;
};

// The tables of `name` when this build has them and this CPU runs them, else nullptr.
bool tables(const std::string& name, Tables& t) {
    const CpuFeatures& cpu = cpu_features();
    if (name == "generic") {
        t = {&isa_generic(), &qgemm_generic::kQgemmIsa};
        return true;
    }
#if defined(MLA_HAVE_AVX2)
    if (name == "avx2" && cpu.has_avx2_table() && isa_avx2()) {
        t = {isa_avx2(), &qgemm_avx2::kQgemmIsa};
        return true;
    }
#endif
#if defined(MLA_HAVE_AVX512)
    if (name == "avx512" && cpu.has_avx512_table() && isa_avx512()) {
        t = {isa_avx512(), &qgemm_avx512::kQgemmIsa};
        return true;
    }
#endif
    (void)cpu;
    return false;
}

bool amx_built() {
#if defined(MLA_HAVE_AMX)
    return true;
#else
    return false;
#endif
}
bool bf16_dots_built() {
#if defined(MLA_HAVE_AVX512BF16)
    return true;
#else
    return false;
#endif
}

[[noreturn]] void refuse(const char* source, const std::string& what) { throw Error(std::string(source) + ": " + what); }

KernelConfig resolve(const std::string& spec, const char* source) {
    std::string isa = "auto", amx = "auto", decode = "auto", qlinear = "auto", fp8 = "auto";
    std::stringstream items(spec);
    std::string item;
    while (std::getline(items, item, ',')) {
        const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        if (a == std::string::npos) continue;  // "isa=avx2," and empty settings
        item = item.substr(a, b - a + 1);
        const size_t eq = item.find('=');
        if (eq == std::string::npos) refuse(source, "'" + item + "' is not key=value");
        const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
        std::string* slot = key == "isa" ? &isa : key == "amx" ? &amx : key == "decode_rows" ? &decode
                            : key == "qlinear" ? &qlinear : key == "fp8_codes" ? &fp8 : nullptr;
        if (!slot) refuse(source, "unknown key '" + key + "' (isa, amx, decode_rows, qlinear, fp8_codes)");
        *slot = value;
    }
    const CpuFeatures& cpu = cpu_features();
    KernelConfig c{};
    Tables t{};
    if (isa == "auto") {
        for (const char* name : {"avx512", "avx2", "generic"})
            if (tables(name, t)) break;
    } else if (isa != "generic" && isa != "avx2" && isa != "avx512") {
        refuse(source, "isa=" + isa + ": not one of auto, generic, avx2, avx512");
    } else if (!tables(isa, t)) {
        refuse(source, "isa=" + isa + ": this build or CPU cannot run it (CPU: " + cpu.names() + ")");
    }
    c.f32 = t.f32;
    c.qgemm = t.qgemm;
    const bool avx512 = std::string(c.f32->name) == "avx512";

    if (amx != "auto" && amx != "0" && amx != "1") refuse(source, "amx=" + amx + ": not one of auto, 0, 1");
    // Only asked of the OS when AMX may run: the grant is per process and cannot be returned.
    const bool amx_here = amx != "0" && amx_built() && avx512 && (cpu.amx_bf16 || cpu.amx_int8) && amx_granted();
    if (amx == "1" && !amx_here)
        refuse(source, "amx=1: AMX cannot run here (needs the build's AMX kernels, an AMX CPU whose tile state "
                       "Linux grants, and isa avx512; CPU: " + cpu.names() + ")");
    c.amx_bf16 = amx_here && cpu.amx_bf16 && cpu.avx512_bf16;
    c.amx_int8 = amx_here && cpu.amx_int8;

    const bool dots_here = bf16_dots_built() && avx512 && cpu.avx512_bf16;
    if (decode == "auto") {
        c.decode_rows = c.amx_bf16 ? DecodeRowsEngine::amx : dots_here ? DecodeRowsEngine::bf16 : DecodeRowsEngine::f32;
    } else if (decode == "f32") {
        c.decode_rows = DecodeRowsEngine::f32;
    } else if (decode == "bf16") {
        if (!dots_here)
            refuse(source, "decode_rows=bf16: AVX512-BF16 dots cannot run here (needs them in the build and CPU, "
                           "and isa avx512; CPU: " + cpu.names() + ")");
        c.decode_rows = DecodeRowsEngine::bf16;
    } else if (decode == "amx") {
        if (!c.amx_bf16) refuse(source, "decode_rows=amx: AMX-BF16 tiles are not enabled here (amx, CPU: " + cpu.names() + ")");
        c.decode_rows = DecodeRowsEngine::amx;
    } else {
        refuse(source, "decode_rows=" + decode + ": not one of auto, f32, bf16, amx");
    }

    if (qlinear == "auto") c.qlinear = QLinearLayout::automatic;
    else if (qlinear == "rows4") c.qlinear = QLinearLayout::rows4;
    else if (qlinear == "tile16") c.qlinear = QLinearLayout::tile16;
    else refuse(source, "qlinear=" + qlinear + ": not one of auto, rows4, tile16");

    const bool lut_here = dots_here && cpu.avx512_vbmi;
    if (fp8 == "auto") c.fp8_lut = lut_here;
    else if (fp8 == "shift") c.fp8_lut = false;
    else if (fp8 == "lut") {
        if (!lut_here)
            refuse(source, "fp8_codes=lut: VBMI lookups in the bf16 dots cannot run here (needs AVX512-BF16 and "
                           "AVX512-VBMI in the build and CPU, and isa avx512; CPU: " + cpu.names() + ")");
        c.fp8_lut = true;
    } else {
        refuse(source, "fp8_codes=" + fp8 + ": not one of auto, shift, lut");
    }
    return c;
}

// Every configuration ever published stays alive: a kernel call on another thread may still hold
// the previous one. They are few (one per configure() call with a new setting).
std::mutex g_mutex;
std::deque<KernelConfig> g_configs;
std::atomic<const KernelConfig*> g_current{nullptr};

const KernelConfig* publish(const KernelConfig& c) {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const KernelConfig& old : g_configs)
        if (describe(old) == describe(c)) return &old;
    g_configs.push_back(c);
    return &g_configs.back();
}

}  // namespace

const KernelConfig& kernels() {
    const KernelConfig* c = g_current.load(std::memory_order_acquire);
    if (!c) {
        // The process's one environment read of the kernels; throws (and is retried) when bad.
        static const KernelConfig* first = [] {
            const char* env = std::getenv(kVariable);
            return publish(resolve(env ? env : "", kVariable));
        }();
        const KernelConfig* expected = nullptr;
        g_current.compare_exchange_strong(expected, first);
        c = g_current.load(std::memory_order_acquire);
    }
    return *c;
}

void configure(const std::string& spec) {
    g_current.store(publish(resolve(spec, "kernel configuration")), std::memory_order_release);
}

int kernels_call(const char* spec, char* out, size_t out_len) {
    std::string text;
    int ok = 1;
    try {
        if (spec && *spec) configure(spec);
        text = describe(kernels());
    } catch (const std::exception& e) {
        text = e.what();
        ok = 0;
    }
    if (out && out_len > 0) {
        const size_t n = std::min(text.size(), out_len - 1);
        std::memcpy(out, text.data(), n);
        out[n] = '\0';
    }
    return ok;
}

const char* cpu_feature_names() {
    static const std::string names = cpu_features().names();
    return names.c_str();
}

std::string describe(const KernelConfig& c) {
    static const char* const kDecode[] = {"f32", "bf16", "amx"};
    static const char* const kLayout[] = {"auto", "rows4", "tile16"};
    return std::string("isa=") + c.f32->name + ",amx=" + (c.amx_bf16 || c.amx_int8 ? "1" : "0") +
           ",decode_rows=" + kDecode[static_cast<int>(c.decode_rows)] + ",qlinear=" +
           kLayout[static_cast<int>(c.qlinear)] + ",fp8_codes=" + (c.fp8_lut ? "lut" : "shift");
}

}  // namespace mla
