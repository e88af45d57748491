// The absorbed form's two products for single-token (decode) rows in AVX512-BF16 vector dot
// products (vdpbf16ps), for CPUs that have AVX512-BF16 but no AMX (AMD Zen 4 and later, Cooper
// Lake): scores q . k over the 576-wide cache rows and the probability-weighted sum of their first
// r columns, products in bf16, sums in f32, as attention_amx.hpp's tiles compute them. Used only
// under compute "bf16" (the runtime's bf16 hint); the f32 kernels of isa_impl.hpp stay the exact
// path, and AMX CPUs take the tiles.
//
// Why the layouts: vdpbf16ps adds, in each f32 lane, the products of one pair of adjacent bf16
// values of each operand. The 16 query rows (heads) of a group sit in the 16 lanes, so neither
// product needs a sum across lanes and the online softmax runs on whole vectors, as on the tiles:
// - scores: Q^T's pairs (lane i = head i's inputs 2p, 2p + 1; built once per task) against a
//   cache row's pair p broadcast to every lane: one instruction adds 2 inputs of 16 heads' scores;
//   a bf16 cache's rows are read where they lie, other formats are converted to bf16 once a chunk;
// - P . V: P^T's pairs (lane i = head i's probabilities of positions j, j + 1) against column c of
//   rows j and j + 1 broadcast: V's first r columns are interleaved by row pairs once a chunk
//   (shared by every head group), and each output column accumulates with the heads in the lanes.
#pragma once

#include <cstdint>
#include <vector>

#include "aligned_vector.hpp"
#include "decode_rows.hpp"

namespace mla {

// The same online-softmax state and interface as attention_amx.hpp's AmxDecodeRows (begin /
// chunk / end; latent_attention.cpp drives either), on vector dot products. begin() needs
// w % 32 == 0 and r % 32 == 0 (the tiles need r % 64).
class Bf16DecodeRows {
public:
    static constexpr int64_t kRows = 64;  // cache rows per chunk
    using Rows = DecodeRowKind;           // what chunk() reads (decode_rows.hpp)
    void begin(const float* q, int64_t m, int64_t w, int64_t r);
    void chunk(const void* const* rows, Rows kind, int64_t n, float scale, const void* const* next = nullptr,
               int64_t next_n = 0);
    void end(float* mx, float* l, float* o, int64_t ldo);

private:
    int64_t m_ = 0, w_ = 0, r_ = 0, groups_ = 0;
    LineVector<uint16_t> qt_, kb_;  // Q^T pairs [groups][w / 2][16 x 2]; the chunk's rows in bf16
    LineVector<uint32_t> vp_, pp_;  // V's row pairs [n / 2][r] (permuted columns); P^T pairs [n / 2][16]
    LineVector<float> st_, ot_;     // scores [n][16]; O^T [groups][r][16] (permuted columns)
    std::vector<float> mx_, l_;
};

}  // namespace mla
