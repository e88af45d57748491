// The one tile configuration our AMX kernels load (attention_amx.cpp: bf16 decode attention;
// qmatmul_amx.cpp: int8-activation products of the integer ops from 8 rows). Whether AMX may run
// (CPU unit, Linux's tile-state grant, the avx512 table, MLA_EXPORT_KERNELS' amx) is
// kernel_config.hpp's amx_bf16 / amx_int8.
#pragma once

#include <cstdint>

#include "kernel_config.hpp"

namespace mla {

// ldtilecfg's 64-byte operand, by default every tile 16 rows of 64 bytes: 16 x 16 f32 / int32
// accumulators, 16 x 32 bf16 or 16 x 64 int8 operands (the attention's one configuration; the
// integer products set fewer rows for token tiles of fewer than 16 tokens).
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
    TileConfig() {
        for (int t = 0; t < 8; ++t) rows[t] = 16, colsb[t] = 64;
    }
};

}  // namespace mla
