#include "numeric.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

namespace mla {

const char* dtype_name(DType t) {
    switch (t) {
        case DType::f32: return "f32";
        case DType::bf16: return "bf16";
        case DType::f16: return "f16";
        case DType::i32: return "i32";
        case DType::i64: return "i64";
        case DType::u8: return "u8";
        default: return "unsupported";
    }
}

void serial_for(int64_t n, const std::function<void(int64_t)>& body) {
    for (int64_t i = 0; i < n; ++i) body(i);
}

void dynamic_for(const Threading& th, int64_t n, const std::function<void(int64_t)>& body) {
    const int64_t workers = std::min<int64_t>(n, th.num_threads);
    if (workers <= 1) return serial_for(n, body);
    std::atomic<int64_t> next{0};
    th.parallel_for(workers, [&](int64_t) {
        for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) body(i);
    });
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal half: value = man * 2^-24
            float f = std::ldexp(static_cast<float>(man), -24);
            std::memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00u;            // NaN
    if (abs >= 0x477ff000u) return sign | 0x7c00u;           // overflow -> inf (incl. inf)
    if (abs < 0x38800000u) {                                 // subnormal or zero in half
        const float a = std::fabs(f);
        return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));  // 2^24, RNE
    }
    uint32_t r = abs - 0x38000000u;                          // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);                          // round to nearest even
    return sign | static_cast<uint16_t>(r >> 13);
}

float e4m3_to_f32(uint8_t b) {
    const int e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 15 && m == 7) v = std::numeric_limits<float>::quiet_NaN();
    else if (e == 0) v = std::ldexp(static_cast<float>(m), -9);  // subnormal: m * 2^-9
    else v = std::ldexp(static_cast<float>(8 + m), e - 10);      // (1 + m/8) * 2^(e - 7)
    return (b & 0x80) ? -v : v;
}

uint8_t f32_to_e4m3(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7fu;
    const float a = std::fabs(f);
    if (a < 0.015625f)  // below 2^-6: subnormal codes m * 2^-9 (m = 8 is the smallest normal, 0x08)
        return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
    // Normal: keep 3 of the 23 mantissa bits, rounding to nearest even (a carry moves the
    // exponent up, as it should), then rebias the exponent 127 -> 7.
    uint32_t r = abs + 0x7ffffu + ((abs >> 20) & 1u);
    r >>= 20;                      // exponent (8 bits) and 3 mantissa bits
    r -= (127u - 7u) << 3;
    if (r > 0x7eu) r = 0x7eu;      // saturate at 448 (0x7f is NaN)
    return sign | static_cast<uint8_t>(r);
}

void to_f32(const void* src, DType dtype, float* dst, int64_t n) {
    switch (dtype) {
        case DType::f32:
            std::memcpy(dst, src, static_cast<size_t>(n) * 4);
            return;
        case DType::bf16: {
            const auto* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
            return;
        }
        case DType::f16: {
            const auto* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
            return;
        }
        default:
            throw Error("internal: to_f32 on a non-float dtype");
    }
}

void from_f32(const float* src, DType dtype, void* dst, int64_t n) {
    switch (dtype) {
        case DType::f32:
            std::memcpy(dst, src, static_cast<size_t>(n) * 4);
            return;
        case DType::bf16: {
            auto* d = static_cast<uint16_t*>(dst);
            for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
            return;
        }
        case DType::f16: {
            auto* d = static_cast<uint16_t*>(dst);
            for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
            return;
        }
        default:
            throw Error("internal: from_f32 on a non-float dtype");
    }
}

}  // namespace mla
