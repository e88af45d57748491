// The weight formats the integer-GEMM layer reads (qgemm.hpp), one entry each, keyed by the ops'
// `bits` attribute. The exporter's quantizer reads the same table in Python
// (mla_export/formats/weight_format.py; tests/test_weight_format.py keeps the two equal), so a new format
// is one entry here and there, its quantizer and its kernels.
//
// Every format lies in the 4-row layout (qgemm.hpp): 16-byte chunks of 4 rows interleaved, a chunk
// holding chunk_inputs inputs of a row; codes whose entry says tile16 may also lie in the tile16
// layout (qmatmul.hpp), which the runtime writes for MlaQLinear and MlaMoeExperts
// (mla_export/runtime/qlinear_tiles.py).
#pragma once

#include <cstdint>

namespace mla {

// The fp8 format's `bits` value: float8 e4m3fn codes, w = e4m3(q) * s, the FP8 weights
// DeepSeek-V3 / R1 and Kimi K2 ship, kept as they are (s: their block scale, one per group of 128
// inputs). fp8 codes lie like int8's (16 a chunk) and run the f32 dot products and panels in
// every mode (bf16 dots on AVX512-BF16 CPUs under the reduced precision).
constexpr int64_t kFp8Bits = 43;  // "e4m3"

struct WeightFormat {
    const char* name;      // the export's weight_format
    int64_t bits;          // the ops' `bits` attribute
    int index;             // the kernels' tables: QgemmIsa::qdot[index], dequant[index], ...
    int codes_per_byte;    // int4: two codes a byte
    int zero_point_max;    // w = (q - zp) * s with a u8 zp <= this per group; 0: no zero point
                           // (w = value(q) * s; the zp inputs hold 0 and are not read)
    int group_multiple;    // inputs per scale group: a multiple of this
    int chunk_inputs;      // a row's inputs in one 16-byte chunk of the 4-row layout
    bool tile16;           // may also lie in the tile16 layout
};

inline constexpr WeightFormat kWeightFormats[] = {
    // name   bits      index  per byte  zp max  group multiple  chunk inputs  tile16
    {"int8", 8, 0, 1, 255, 32, 16, true},
    {"int4", 4, 1, 2, 15, 32, 32, true},
    {"fp8", kFp8Bits, 2, 1, 0, 32, 16, true},
};
constexpr int kWeightCodes = sizeof(kWeightFormats) / sizeof(kWeightFormats[0]);

// The format of an op's `bits`, or nullptr.
inline const WeightFormat* weight_format(int64_t bits) {
    for (const WeightFormat& f : kWeightFormats)
        if (f.bits == bits) return &f;
    return nullptr;
}
inline bool weight_bits_valid(int64_t bits) { return weight_format(bits) != nullptr; }
inline int weight_code_index(int64_t bits) { return weight_format(bits)->index; }  // bits valid
constexpr const char* kWeightBitsExpected = "4 (int4), 8 (int8) or 43 (fp8 e4m3)";

}  // namespace mla
