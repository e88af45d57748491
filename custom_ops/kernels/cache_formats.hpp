// The cache-format registry: every latent-cache row format the kernels know, as one traits
// struct each, and the one list (CacheFormats) from which everything else is derived: the
// attribute names (kv_dtype_from_name), scale groups and row bytes (cache_format.cpp), the
// quantising write (store_row) and the ISA tables' load_rows (isa_impl.hpp), which are
// templates over these traits. Adding a format is an enum value, a traits struct and its entry
// in CacheFormats here (a quantised one with a new code type also names that code type's
// scalar encode/decode below; a SIMD widening for it in isa_impl.hpp is optional speed);
// mla_export/formats/kv_formats.py is the same registry in Python. docs/KERNELS.md walks through it.
//
// Row layouts (W = r + dr values; cache_format.hpp says why):
//   float rows      W x elem
//   quantised rows  r x 1-byte code | G x f32 scale | dr x bf16 k_pe; value = code * scale of
//                   its group of r / G codes, scale = max|group| / Code::top.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "mla_tensor.hpp"
#include "numeric.hpp"

namespace mla {

enum class KvDtype { automatic, f32, bf16, f16, int8, fp8, e5m2 };

// Code types of quantised rows: one byte per value; `top` is the largest magnitude a code
// holds (the write picks scale = max|group| / top, so the group's largest value maps to it);
// encode rounds y = x / scale (|y| <= top) to a code, decode reads one back.
struct Int8Code {
    using Storage = int8_t;
    static constexpr float top = 127.f;
    static const char* word() { return "int8"; }
    static Storage encode(float y) {  // round half to even, clipped to +-127 (never -128)
        return static_cast<Storage>(std::min(127.f, std::max(-127.f, std::nearbyint(y))));
    }
    static float decode(Storage c) { return static_cast<float>(c); }
};

struct E4m3Code {  // float8 e4m3fn (numeric.hpp)
    using Storage = uint8_t;
    static constexpr float top = 448.f;
    static const char* word() { return "e4m3fn"; }
    static Storage encode(float y) { return f32_to_e4m3(y); }
    static float decode(Storage c) { return e4m3_to_f32(c); }
};

struct E5m2Code {  // float8 e5m2: the top byte of an IEEE half (1 sign, 5 exponent, 2 mantissa bits)
    using Storage = uint8_t;
    static constexpr float top = 57344.f;  // the largest finite e5m2
    static const char* word() { return "e5m2"; }
    // Round to nearest even, as ml_dtypes' float32 -> float8_e5m2 (beyond the largest finite: inf).
    static Storage encode(float y) {
        uint32_t bits;
        std::memcpy(&bits, &y, 4);
        const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
        const uint32_t abs = bits & 0x7fffffffu;
        if (abs > 0x7f800000u) return sign | 0x7fu;  // NaN
        const float a = std::fabs(y);
        if (a < 6.103515625e-05f)  // below 2^-14: subnormal codes m * 2^-16 (m = 4 is the smallest normal)
            return sign | static_cast<uint8_t>(std::nearbyint(a * 65536.0f));
        // Normal: keep 2 of the 23 mantissa bits, rounding to nearest even (a carry moves the
        // exponent up), then rebias the exponent 127 -> 15; 0x7c is inf.
        uint32_t r = (abs + 0xfffffu + ((abs >> 21) & 1u)) >> 21;
        r -= (127u - 15u) << 2;
        return sign | static_cast<uint8_t>(r > 0x7cu ? 0x7cu : r);
    }
    static float decode(Storage c) { return f16_to_f32(static_cast<uint16_t>(c << 8)); }
};

// W values of `elem` per row (read in place when f32, widened otherwise).
template <KvDtype K, DType E>
struct FloatRows {
    static constexpr KvDtype kind = K;
    static constexpr DType elem = E;  // of the cache tensor (or its u8 bytes)
    static constexpr int64_t groups = 0;
};

// r codes in `G` equal groups, G f32 scales, then the W - r k_pe values as bf16.
template <KvDtype K, class C, int64_t G>
struct QuantisedRows {
    using Code = C;
    static constexpr KvDtype kind = K;
    static constexpr DType elem = DType::u8;
    static constexpr int64_t groups = G;
    static_assert(sizeof(typename C::Storage) == 1, "RowFormat's offsets count one byte per code");
    static_assert(G >= 1, "a quantised row has at least one scale");
};

struct F32Rows : FloatRows<KvDtype::f32, DType::f32> { static constexpr const char* name = "f32"; };
struct Bf16Rows : FloatRows<KvDtype::bf16, DType::bf16> { static constexpr const char* name = "bf16"; };
struct F16Rows : FloatRows<KvDtype::f16, DType::f16> { static constexpr const char* name = "f16"; };
// 4 groups: 128 values at r = 512, the layout of DeepSeek's own 656-byte cache entry (a uniform
// step shrinks with its group's maximum).
struct Int8Rows : QuantisedRows<KvDtype::int8, Int8Code, 4> { static constexpr const char* name = "int8"; };
// One scale per row: 3 mantissa bits are relative to each value, so more scales barely change
// the error (docs/KV_CACHE.md).
struct Fp8Rows : QuantisedRows<KvDtype::fp8, E4m3Code, 1> { static constexpr const char* name = "fp8"; };

// e5m2 codes: vLLM's other fp8 cache; 2 mantissa bits, so twice fp8's step (one scale per row
// for the same reason as fp8's).
struct E5m2Rows : QuantisedRows<KvDtype::e5m2, E5m2Code, 1> { static constexpr const char* name = "e5m2"; };

template <class... F>
struct FormatList {};
using CacheFormats = FormatList<F32Rows, Bf16Rows, F16Rows, Int8Rows, Fp8Rows, E5m2Rows>;

template <class Fn, class... F>
bool visit_format(FormatList<F...>, KvDtype k, Fn& fn) {
    return ((k == F::kind && (fn(F{}), true)) || ...);
}
template <class Fn, class... F>
void visit_all(FormatList<F...>, Fn& fn) {
    (fn(F{}), ...);
}

// Calls fn(F{}) with the traits F of format k (one branch per call: the loops inside fn are
// instantiated per format). Returns false for KvDtype::automatic, which names no format.
template <class Fn>
bool with_format(KvDtype k, Fn&& fn) {
    return visit_format(CacheFormats{}, k, fn);
}

// Calls fn(F{}) for every registered format, in CacheFormats' order.
template <class Fn>
void for_each_format(Fn&& fn) {
    visit_all(CacheFormats{}, fn);
}

// Whether format k stores codes with scales (false for float rows and automatic).
inline bool quantised(KvDtype k) {
    bool q = false;
    with_format(k, [&](auto f) { q = decltype(f)::groups > 0; });
    return q;
}

}  // namespace mla
