// Included by isa_<target>.cpp with MLA_ISA_NS defined: the same source compiled for several
// instruction sets. GCC/Clang vector extensions (8 x f32) map to one ymm register under AVX2
// and to two xmm registers in the baseline build.
#include <cmath>
#include <cstring>

#include "isa.hpp"
#include "numeric.hpp"

namespace mla {
namespace MLA_ISA_NS {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f loadu(const float* p) {
    v8f v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}
static inline void storeu(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }
static inline v8f splat(float x) { return v8f{x, x, x, x, x, x, x, x}; }

// Register-blocked micro-kernel: MR rows of A times a 16-wide panel of B, accumulated in
// MR x 2 vector registers (12 of AVX2's 16 at MR = 6); B's panel row is loaded once per k and
// shared by all MR rows.
template <int MR>
static inline void micro16(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                           float* c, int64_t ldc, bool accumulate) {
    v8f acc[MR][2];
    for (int i = 0; i < MR; ++i) {
        if (accumulate) {
            acc[i][0] = loadu(c + i * ldc);
            acc[i][1] = loadu(c + i * ldc + 8);
        } else {
            acc[i][0] = splat(0.f);
            acc[i][1] = splat(0.f);
        }
    }
    for (int64_t p = 0; p < k; ++p) {
        const v8f b0 = loadu(b + p * ldb), b1 = loadu(b + p * ldb + 8);
        for (int i = 0; i < MR; ++i) {
            const v8f av = splat(a[i * lda + p]);
            acc[i][0] += av * b0;
            acc[i][1] += av * b1;
        }
    }
    for (int i = 0; i < MR; ++i) {
        storeu(c + i * ldc, acc[i][0]);
        storeu(c + i * ldc + 8, acc[i][1]);
    }
}

template <int MR>
static inline void micro8(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                          float* c, int64_t ldc, bool accumulate) {
    v8f acc[MR];
    for (int i = 0; i < MR; ++i) acc[i] = accumulate ? loadu(c + i * ldc) : splat(0.f);
    for (int64_t p = 0; p < k; ++p) {
        const v8f b0 = loadu(b + p * ldb);
        for (int i = 0; i < MR; ++i) acc[i] += splat(a[i * lda + p]) * b0;
    }
    for (int i = 0; i < MR; ++i) storeu(c + i * ldc, acc[i]);
}

typedef void (*MicroFn)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool);

static void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    static const MicroFn k16[7] = {nullptr, micro16<1>, micro16<2>, micro16<3>, micro16<4>, micro16<5>, micro16<6>};
    static const MicroFn k8[7] = {nullptr, micro8<1>, micro8<2>, micro8<3>, micro8<4>, micro8<5>, micro8<6>};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int64_t i = 0; i < m; i += 6) {
            const int64_t mr = m - i < 6 ? m - i : 6;
            k16[mr](k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate);
        }
    for (; j + 8 <= n; j += 8)
        for (int64_t i = 0; i < m; i += 6) {
            const int64_t mr = m - i < 6 ? m - i : 6;
            k8[mr](k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate);
        }
    // Columns past the last multiple of 8 (small head dims, odd block sizes): plain loops.
    for (; j < n; ++j)
        for (int64_t i = 0; i < m; ++i) {
            float s = accumulate ? c[i * ldc + j] : 0.f;
            for (int64_t p = 0; p < k; ++p) s += a[i * lda + p] * b[p * ldb + j];
            c[i * ldc + j] = s;
        }
}

static void load_f32(const void* src, DType dtype, float* dst, int64_t n) {
    if (dtype == DType::bf16) {
        // bf16 -> f32 is a 16-bit left shift; written so the compiler vectorises it.
        const auto* s = static_cast<const uint16_t*>(src);
        for (int64_t i = 0; i < n; ++i) {
            const uint32_t bits = static_cast<uint32_t>(s[i]) << 16;
            std::memcpy(dst + i, &bits, 4);
        }
        return;
    }
    to_f32(src, dtype, dst, n);
}

// exp(x) for x <= 0 (softmax after subtracting the max), as 2^(x log2 e) split into an integer
// power (built in the exponent bits) and a degree-6 polynomial on [-0.5, 0.5]; relative error
// ~2e-7. -inf and very negative inputs give 0.
static inline v8f exp_neg(v8f x) {
    const v8f lo = splat(-87.3f);
    x = x < lo ? lo : x;  // vector compare+select; keeps 2^n representable
    const v8f t = x * splat(1.44269504088896341f);
    // Round to nearest with the 1.5 * 2^23 trick (|t| < 2^22 here), branch-free and vectorised.
    const v8f n = (t + splat(12582912.0f)) - splat(12582912.0f);
    const v8f f = t - n;  // in [-0.5, 0.5]
    v8f p = splat(1.535336188319500e-4f);
    p = p * f + splat(1.339887440266574e-3f);
    p = p * f + splat(9.618437357674640e-3f);
    p = p * f + splat(5.550332471162809e-2f);
    p = p * f + splat(2.402264791363012e-1f);
    p = p * f + splat(6.931472028550421e-1f);
    p = p * f + splat(1.0f);
    const v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    v8f scale;
    std::memcpy(&scale, &e, sizeof(scale));
    const v8f r = p * scale;
    return x <= lo ? splat(0.f) : r;
}

static float exp_sum(float* x, int64_t n, float shift) {
    v8f acc = splat(0.f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8f e = exp_neg(loadu(x + i) - splat(shift));
        storeu(x + i, e);
        acc += e;
    }
    float s = 0.f;
    for (int j = 0; j < 8; ++j) s += acc[j];
    for (; i < n; ++i) {
        x[i] = std::exp(x[i] - shift);
        s += x[i];
    }
    return s;
}

static const IsaKernels table = {MLA_ISA_NAME, gemm, load_f32, exp_sum};

}  // namespace MLA_ISA_NS
}  // namespace mla
