// Whether AMX tiles may be used here, and the one tile configuration our AMX kernels load
// (attention_amx.cpp: bf16 decode attention; qmatmul_amx.cpp: int8-activation products of the
// integer ops from 8 rows). Only called when the build has them (MLA_HAVE_AMX).
#pragma once

#include <cstdint>

namespace mla {

// The CPU has AMX-TILE and the unit (AMX-BF16 with AVX512-BF16, or AMX-INT8), Linux granted this
// process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, which OpenVINO's own AMX kernels
// also request), MLA_EXPORT_AMX is not "0" (an A/B switch) and the kernels run their AVX-512 table
// (an MLA_EXPORT_ISA below it means no AMX either).
bool amx_bf16_usable();
bool amx_int8_usable();

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
