// The element formats of a latent cache row and how the kernels read and write them.
//
// A row holds [kv_c (r values) | k_pe (dr values)], W = r + dr. Formats (`kv_dtype`):
//   f32   W x f32                                       (4W bytes;  2304 for DeepSeek)
//   bf16  W x bf16                                      (2W bytes;  1152)
//   f16   W x IEEE half                                 (2W bytes;  1152)
//   int8  r x int8 code | 4 x f32 scale | dr x bf16 k_pe (r + 16 + 2dr bytes; 656)
//   fp8   r x e4m3fn    | 1 x f32 scale | dr x bf16 k_pe (r + 4 + 2dr bytes;  644)
// int8/fp8 quantise only the latent part kv_c, in G = scale_groups() equal groups of r / G
// values with one f32 scale each: int8 4 groups (128 values at r = 512: DeepSeek's own fp8 entry
// layout; a uniform step shrinks with the group's maximum), fp8 one per row (its 3 mantissa bits
// are relative to each value, so a scale layout barely changes its error; docs/KV_CACHE.md). The scales sit
// between codes and k_pe so that one row read brings everything. k_pe keeps bf16 as in
// DeepSeek's entry: rotary keys need the range. Value = code * scale; the write picks
// scale = max|group| / 127 (int8) or / 448 (fp8), so the largest value maps to the largest
// code; an all-zero group has scale 0, a group with a non-finite value a NaN scale (its scores
// become NaN: loud, never silently wrong).
//
// In graphs every 16-bit and quantised cache is bound as raw bytes u8 [NB, BS, row bytes]
// (OpenVINO's CPU plugin copies bf16/f16 inputs of a custom op), so the ops take the format
// from their `kv_dtype` attribute; "" (absent) means: by the tensor's element type, u8 = bf16.
#pragma once

#include <cstdint>
#include <string>

#include "mla_tensor.hpp"
#include "row_format.hpp"

namespace mla {

// "" or "auto" -> automatic; "f32", "bf16", "f16", "int8", "fp8"; anything else throws naming op.
KvDtype kv_dtype_from_name(const char* op, const std::string& name);
const char* kv_dtype_name(KvDtype t);

// f32 scales per int8/fp8 row (int8 4, fp8 1; 0 for the float formats).
int64_t scale_groups(KvDtype t);

// Bytes of one row of W = r + dr values.
int64_t row_bytes(KvDtype t, int64_t r, int64_t dr);

// A validated cache: where its rows are and how to read them.
struct CacheRows {
    TensorView logical;  // the cache with shape [NB, BS, W] (for shape checks and messages)
    KvDtype kind;        // resolved, never automatic
    DType elem;          // element type of f32/bf16/f16 rows (u8 for int8/fp8)
    int64_t width;       // W
    int64_t rank;        // r: the quantised columns (int8/fp8); W otherwise
    int64_t row_bytes;
    char* base;
    RowFormat format;    // what the ISA tables' load_rows reads (kind, width, rank, groups)

    const char* row(int64_t block, int64_t offset) const {
        return base + (block * logical.dim(1) + offset) * row_bytes;
    }
};

// Resolves the format and validates the cache tensor against it. `rank` is r (needed for
// int8/fp8 rows, whose width in bytes does not give r; pass the op's r, or -1 where unknown
// for the float formats). Throws mla::Error naming the input on any mismatch.
CacheRows cache_rows(const char* op, const TensorView& kv_cache, KvDtype kind, int64_t rank, bool writable);

// Writes src[0 .. W) as one row (rounding / quantising as described above).
void store_row(const CacheRows& c, const float* src, void* row);

}  // namespace mla
