// The attention's expanded form (long prefills, latent_attention.cpp's expanded_task) in AVX512-BF16
// vector dot products (vdpbf16ps) under compute "bf16": the scores q . k over a head's 192-wide key
// rows and the probability-weighted sums of its 128-wide value rows, products in bf16 and sums in
// f32, where the f32 kernels (row_dot, gemm_packed) do 16 multiply-adds an instruction and these
// 32. The online softmax stays f32 (softmax_step). Used on CPUs with AVX512-BF16, AMX ones too,
// where the kernel configuration's decode_rows engine allows bf16 products (kernel_config.hpp).
//
// Layouts (one dword = a pair of bf16 values, the first in the low half, as vdpbf16ps pairs them):
// - query rows, and probability rows: a row of w values in bf16 is w / 2 pair dwords as it lies;
// - key rows of a span, 16 to a group: K^T pairs [group][pair p][16], dword i = key 16g + i's values
//   2p, 2p + 1, so one load holds a pair of 16 keys and a query's pair broadcast scores all 16;
// - value rows, by pairs of rows: V pairs [row pair j][dv], dword c = column c of rows 2j and
//   2j + 1, so one load holds 16 columns of two rows and a probability pair broadcast weighs both.
#pragma once

#include <cstdint>

namespace mla {

// x [m, w] f32 rows (stride ldx, w even) -> bf16 pair dwords xp [m, w / 2] (stride ldxp), rounded to
// nearest even.
void bf16_row_pairs(int64_t m, int64_t w, const float* x, int64_t ldx, uint32_t* xp, int64_t ldxp);
// Key rows k [n, dk] (stride ldk, dk even) -> K^T pairs kt[(g * dk / 2 + p) * 16 + i] for groups
// g < ceil(n / 16); keys past n are zero.
void bf16_key_pairs(int64_t n, int64_t dk, const float* k, int64_t ldk, uint32_t* kt);
// Value rows [n, dv] (V[j, c] at v[(c / 16) * ps + j * rs + c % 16]: row-major with rs = ldv, ps =
// 16; in gemm_packed's 16-column panels with rs = 16; dv % 16 == 0) -> V pairs vt[j * dv + c] for
// row pairs j < ceil(n / 2); the row past n of an odd n is zero. Also a weight [k, dv] read as
// rows of k inputs: its pairs are the right operand of bf16_weighted_sum's products.
void bf16_value_pairs(int64_t n, int64_t dv, const float* v, int64_t rs, int64_t ps, uint32_t* vt);
// s[i * lds + j] = q_i . k_j for i < m, j < n <= 64: q pairs qp (row stride ldqp dwords) of `pairs`
// pairs, keys from kt (the chunk's first group; group stride pairs * 16 dwords).
void bf16_scores(int64_t m, int64_t n, int64_t pairs, const uint32_t* qp, int64_t ldqp, const uint32_t* kt, float* s,
                 int64_t lds);
// o[i * ldo + c] += sum_{j < keys} p_i[j] * v_j[c] for i < m, c < dv (dv % 16 == 0): probability
// pairs pp (row stride ldpp dwords), V pairs vt from the first key. An odd `keys` drops the last
// pair's second row (its value never meets the row's zero probability: 0 x Inf would be NaN).
// With a latent row's pairs for p and a weight's pairs for vt, the same product up-projects.
void bf16_weighted_sum(int64_t m, int64_t keys, const uint32_t* pp, int64_t ldpp, const uint32_t* vt, int64_t dv,
                       float* o, int64_t ldo);

}  // namespace mla
