// The integer-GEMM layer: products of activation rows with weight rows stored as codes, which
// MlaMoeExperts, MlaQLinear (and through them the attention's projections) run on. Its vectorised
// pieces are compiled once per instruction set from qgemm_impl.hpp (qgemm_avx512.cpp,
// qgemm_avx2.cpp, qgemm_generic.cpp); the kernel configuration (kernel_config.hpp) picks the table
// for the CPU at hand; the tile routine that drives them is qmatmul.hpp's. The formats of the
// codes are weight_format.hpp's.
//
// Weights are rows of integer codes with a scale and a zero point per group of `group` inputs:
// w[k] = (q[k] - zp[k / group]) * s[k / group]. Codes are stored in blocks of 4 rows, interleaved
// by 16-byte chunks: chunk c of rows 4b..4b+3 sits at ((b * chunks + c) * 4 + r) * 16, so one call
// over 4 rows reads one contiguous run of memory (and consecutive calls continue it), which the
// hardware prefetcher streams at full speed; 4 separate short rows it does not. A chunk holds 16
// int8 codes (inputs 16c..16c+15), or 32 int4 codes: byte j carries input 32c + j in its low
// nibble and input 32c + 16 + j in its high nibble, so one 16-byte load unpacks to two 16-lane
// vectors.
#pragma once

#include <cstdint>

#include "weight_format.hpp"

namespace mla {

// Four weight rows: their interleaved codes, and each row's per-group scales and zero points.
struct QBlock {
    const uint8_t* q;
    const float* s[4];
    const uint8_t* zp[4];
    // Optional: the block's per-group factors as the table's qdot_q8 takes them, written once by its
    // q8_lanes where one call's tile runs many passes of tokens over the same rows (prefill); null:
    // the kernel builds them from s and zp at each group, which for groups of 64-128 inputs cost about
    // as much as the group's dot products of 4 tokens.
    const float* lanes = nullptr;
};

// One activation row quantised to int8 for the integer dot products (few tokens under a
// reduced-precision hint, as the CPU plugin's own dynamic quantisation does for its compressed
// matmuls on VNNI CPUs): x[k] ~= d[k / block] * q[k], with d[b] = max|x over block b| / 127.
// The block is the largest of 128, 64, 32 that divides the weight group (q8_block), so int32 sums
// run over a whole block and are scaled once per block (llama.cpp's K-quant activations use 256);
// gsum[g] = sum of d * q over weight group g, which carries the zero points' term.
struct QRow {
    const int8_t* q;
    const float* d;
    const float* gsum;
    int64_t block;
};

inline int64_t q8_block(int64_t group) { return group % 128 == 0 ? 128 : group % 64 == 0 ? 64 : 32; }

// Quantises x [K] into q [K], d [K / block] and gsum [K / group] (block = q8_block(group)).
void quantize_row_q8(int64_t K, int64_t group, const float* x, int8_t* q, float* d, float* gsum);

// Records activation block b's scale and adds its share (scale x its int32 code sum) to its weight
// group's gsum, starting the group's sum at its first block: every quantizer's per-block end.
inline void finish_q8_block(int64_t b, int64_t block, int64_t group, float scale, int32_t sum, float* d, float* gsum) {
    d[b] = scale;
    const int64_t g = (block * b) / group;
    if ((block * b) % group == 0) gsum[g] = 0.f;
    gsum[g] += scale * static_cast<float>(sum);
}

// e4m3 codes widened through float16 (sign and the 7 other bits moved into place) come out as
// their value / 256, exactly (normal and subnormal codes alike): the kernels fold 256 into the scale.
constexpr float kE4m3ViaF16 = 256.f;

constexpr int64_t kQ8LaneFloats = 32;  // a group's factors in QBlock::lanes: 16 scales, 16 scale x zero point / 4

struct QgemmIsa {
    const char* name;
    // out[t * ldo + r] = sum_k x[t][k] * w_r[k] for the 4 rows r of a block and M = 1..4 rows t
    // (index M - 1), dequantising in registers; xsum[t][g] = sum of x[t] over group g (for the zero
    // points). Index: the weight format's (weight_format.hpp: 0 = int8, 1 = int4, 2 = fp8).
    void (*qdot[kWeightCodes][4])(int64_t K, int64_t group, const float* const* x, const float* const* xsum,
                       const QBlock& blk, float* out, int64_t ldo);
    // dst[r * kb + p] = w_r[k0 + p] for the 4 rows of each of n blocks (row r = 4 * block + row in
    // block) and p < kb (k0, kb multiples of 32).
    void (*dequant[kWeightCodes])(int64_t n, const QBlock* blocks, int64_t k0, int64_t kb, int64_t group, float* dst);
    // out[t * ldo + r] += sum_p a[t][k0 + p] * w[r * kb + p] for 4 rows r and M = 1..4 rows t.
    void (*fdot[4])(int64_t k0, int64_t kb, const float* const* a, const float* w, float* out, int64_t ldo);
    // qdot on int8 activation rows (u8 codes x s8 activations summed in int32 by AVX512_VNNI
    // vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd, then scaled per activation block and per group in
    // f32): [bits][nb - 1][M - 1] runs
    // the 4 x nb rows of blk[0..nb) against M = 1..4 activation rows; null where not compiled.
    void (*qdot_q8[2][2][4])(int64_t K, int64_t group, const QRow* x, const QBlock* blk, float* out, int64_t ldo);
    // The per-group factors qdot_q8 reads from QBlock::lanes, for `groups` groups of blk (kQ8LaneFloats
    // floats a group, 64-byte aligned out); null where qdot_q8 builds them itself at every group.
    void (*q8_lanes)(int64_t groups, const QBlock& blk, float* out);
    // quantize_row_q8, bit for bit (round to nearest even, as std::nearbyint), in vector code
    // where the table has it: prefill quantises every activation row of every integer matmul.
    void (*quantize_q8)(int64_t K, int64_t group, const float* x, int8_t* q, float* d, float* gsum);
    // qdot_q8 on int8 or int4 codes in 16-row tiles (qmatmul.hpp's tile16 layout): [bits][nb - 1][M - 1]
    // runs nb tiles of 16 rows side by side, the b-th `step` rows after the first (q + b * step * the
    // row's bytes: 16 for a run of rows, more for an MoE expert's gate and up tiles), against M = 1..4
    // activation rows; s and zp point at the first tile's factors (the tile16 layout's, 16 a group;
    // the b-th tile's at b * step * groups). out[t * ldo + 16 * b + r]. Null but on VNNI CPUs.
    void (*qdot_q8_t16[2][2][4])(int64_t K, int64_t group, const QRow* x, const uint8_t* q, const float* s,
                              const uint8_t* zp, int64_t groups, int64_t step, float* out, int64_t ldo);
    // fp8 codes against bf16 activation rows, the reduced-precision mode's fp8 dots where the CPU has
    // AVX512_BF16: each code's bf16 bits made in registers (sign, exponent + 120, mantissa: exact for
    // every normal code and zero; the subnormal codes, below 2^-6 of their scale's unit, count as 0,
    // as vdpbf16ps would take them), vdpbf16ps pairs summed in f32 and each group folded with its
    // scale. [M - 1]; null where not compiled (qmode_fp8 checks the CPU).
    void (*qdot_fp8_bf16[4])(int64_t K, int64_t group, const uint16_t* const* x, const QBlock& blk, float* out,
                             int64_t ldo);
    // The same with the codes widened by AVX512-VBMI byte lookups (fp8_codes=lut, kernel_config.hpp),
    // up to 8 rows a pass (its one accumulator a token leaves room for 8; the shifts' four a token
    // would spill). [M - 1]; null where not compiled (kernel_config checks the CPU).
    void (*qdot_fp8_bf16_lut[8])(int64_t K, int64_t group, const uint16_t* const* x, const QBlock& blk, float* out,
                                 int64_t ldo);
    // Many rows of x against fp8 codes under fp8_codes=lut: a 4-row block's codes widened once into
    // bf16 lines (K / 16 lines of 64 bf16, 64-byte aligned: the lookups' two vectors per line of
    // codes), which qdot_bf16_lines' passes of up to 8 rows [M - 1] then read instead of widening
    // the codes again each pass. Null where not compiled (as qdot_fp8_bf16_lut).
    void (*widen_fp8_lines)(int64_t K, const uint8_t* q, uint16_t* lines);
    void (*qdot_bf16_lines[8])(int64_t K, int64_t group, const uint16_t* const* x, const uint16_t* lines,
                               const QBlock& blk, float* out, int64_t ldo);
    // fp8 codes in 16-row tiles (qmatmul.hpp's tile16 layout) on bf16 rows, under fp8_codes=lut:
    // [nb - 1][M - 1] runs nb tiles of 16 rows (the b-th `step` rows after the first, as
    // qdot_q8_t16's) against M = 1..8 rows; s points at the first tile's scales (as qdot_q8_t16's);
    // out[t * ldo + 16 * b + r]. Null where not compiled (as qdot_fp8_bf16_lut).
    void (*qdot_fp8_t16[2][8])(int64_t K, int64_t group, const uint16_t* const* x, const uint8_t* q, const float* s,
                               int64_t groups, int64_t step, float* out, int64_t ldo);
};

}  // namespace mla
