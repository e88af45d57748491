// qtile's int8-activation products from 8 activation rows (decode batches, prefill) on AMX-INT8
// tiles, under the reduced-precision mode on CPUs with AMX-INT8 (Sapphire Rapids and later Xeons);
// see amx.hpp.
//
// The same sums as the VNNI kernel (qgemm_impl.hpp's qdot_q8): int32 dot products of the u8
// codes with the int8 activations over each activation block, scaled by the row's group scale and
// the block's d, less the zero points' term through gsum. A product tile C[16 tokens x 16 weight
// rows] += A[16 tokens x 64 int8] . B[16 x 16 x 4 u8] (tdpbsud) takes the activation rows as they
// lie and the weights re-laid once per call into B's layout (dword n of row kq = the codes of
// weight row n at inputs 4kq..4kq+3): one 32-row tile's weights are re-laid once, step by step
// as the first 32 tokens' products run, and serve every token of the call. Token tiles of fewer
// than 16 rows are configured as such (a batch of 8 decode tokens multiplies no padding).
#pragma once

#include <cstdint>

#include "qmatmul.hpp"

namespace mla {

// Whether qtile_amx can run this call's shape: activation blocks of 64 or 128 inputs (a tile step
// is 64 inputs).
inline bool qtile_amx_fits(int64_t K, int64_t group) { return K % 64 == 0 && q8_block(group) % 64 == 0; }

// c[t * kTileRows + r] = act(rows[t]) . w_r for the m rows `rows` of acts (int8 rows) and the 32
// weight rows of `blocks` (bits_index 0 = int8 codes, 1 = int4), as qtile.
void qtile_amx(int bits_index, const QActs& acts, const int64_t* rows, int64_t m, const QBlock* blocks, int64_t K,
               int64_t group, float* c);

// The same on int8 codes in the tile16 layout (qmatmul.hpp: the 32 rows at q, s / zp at their first
// row's groups): tile16 lines are B tiles as they lie, loaded without a re-layout.
// fp8 codes (4-row layout) on AMX-BF16 tiles against the bf16 rows of acts (qmatmul_fp8_amx.cpp);
// K and group multiples of 32.
void qtile_fp8_amx(const QActs& acts, const int64_t* rows, int64_t m, const QBlock* blocks, int64_t K, int64_t group,
                   float* c);

void qtile16_amx(const QActs& acts, const int64_t* rows, int64_t m, const uint8_t* q, const float* s,
                 const uint8_t* zp, int64_t groups, int64_t K, int64_t group, float* c);

}  // namespace mla
