// How the kernels validate, read and write latent cache rows of the formats registered in
// cache_formats.hpp (the registry: names, code types, scale groups; everything here is derived
// from it, with no per-format branch).
//
// A row holds [kv_c (r values) | k_pe (dr values)], W = r + dr. Float formats store W values of
// their element type (f32 2304 bytes, bf16/f16 1152 for DeepSeek). Quantised formats store
//   r x 1-byte code | G x f32 scale | dr x bf16 k_pe   (r + 4G + 2dr bytes)
// quantising only the latent part kv_c, in G = scale_groups() equal groups of r / G values with
// one f32 scale each. The scales sit between codes and k_pe so that one row read brings
// everything. k_pe keeps bf16 as in DeepSeek's entry: rotary keys need the range.
// Value = code * scale; the write picks scale = max|group| / Code::top, so the largest value
// maps to the largest code; an all-zero group has scale 0, a group with a non-finite value a NaN
// scale (its scores become NaN: loud, never silently wrong).
//
// In graphs every 16-bit and quantised cache is bound as raw bytes u8 [NB, BS, row bytes]
// (OpenVINO's CPU plugin copies bf16/f16 inputs of a custom op), so the ops take the format
// from their `kv_dtype` attribute; "" (absent) means: by the tensor's element type, u8 = bf16.
#pragma once

#include <cstdint>
#include <string>

#include "decode_rows.hpp"
#include "mla_tensor.hpp"
#include "row_format.hpp"

namespace mla {

// "" or "auto" -> automatic; a registered name -> its format; anything else throws naming op
// and listing the registered names.
KvDtype kv_dtype_from_name(const char* op, const std::string& name);
const char* kv_dtype_name(KvDtype t);

// f32 scales per quantised row (the format's groups; 0 for the float formats).
int64_t scale_groups(KvDtype t);

// Bytes of one row of W = r + dr values.
int64_t row_bytes(KvDtype t, int64_t r, int64_t dr);

// A validated cache: where its rows are and how to read them.
struct CacheRows {
    TensorView logical;  // the cache with shape [NB, BS, W] (for shape checks and messages)
    KvDtype kind;        // resolved, never automatic
    DType elem;          // element type of float rows (u8 for quantised rows)
    bool quantised;      // codes with group scales (else float rows)
    int64_t width;       // W
    int64_t rank;        // r: the quantised columns; W for float rows
    int64_t row_bytes;
    char* base;
    RowFormat format;    // what the ISA tables' load_rows reads (kind, width, rank, groups)

    const char* row(int64_t block, int64_t offset) const {
        return base + (block * logical.dim(1) + offset) * row_bytes;
    }
    // f32 rows are read where they live as f32 values.
    bool in_place() const { return elem == DType::f32; }
    // How the bf16 decode-row engines read float rows in place (quantised rows are widened to
    // f32 rows by load_rows first).
    DecodeRowKind float_kind() const {
        return elem == DType::bf16 ? DecodeRowKind::bf16 : elem == DType::f16 ? DecodeRowKind::f16 : DecodeRowKind::f32;
    }
};

// Resolves the format and validates the cache tensor against it. `rank` is r (needed for
// quantised rows, whose width in bytes does not give r; pass the op's r, or -1 where unknown
// for the float formats). Throws mla::Error naming the input on any mismatch.
CacheRows cache_rows(const char* op, const TensorView& kv_cache, KvDtype kind, int64_t rank, bool writable);

// Writes src[0 .. W) as one row (rounding / quantising as described above).
void store_row(const CacheRows& c, const float* src, void* row);

}  // namespace mla
