// The lightning indexer's scores on AMX bf16 tiles (sparse_indexer.cpp, under compute "bf16" on
// CPUs with AMX-BF16): for a chunk of up to 64 keys, S^T = K . Q^T with the keys as A tiles (a bf16
// cache's blocks read where they lie, other formats converted to bf16 rows once per chunk) and
// Q^T's bf16 pairs as B tiles built once per call (attention_amx.hpp explains the layouts), then
// relu and the weighted sum over heads with 16 positions in the lanes of a vector. The f32 path
// (row_dot) stays the exact one.
#pragma once

#include <cstdint>
#include <vector>

#include "aligned_vector.hpp"
#include "decode_rows.hpp"

namespace mla {

class AmxIndexerScores {
public:
    static constexpr int64_t kRows = 64;  // keys per chunk
    // Whether the shapes fit: heads % 16 == 0 and 32 <= d <= 512 with d % 32 == 0.
    static bool fits(int64_t heads, int64_t d);
    // q [tokens * heads, d] f32 rows (RoPE applied), w [tokens * heads] (every positive factor in).
    void begin(const float* q, const float* w, int64_t tokens, int64_t heads, int64_t d);
    // out[t * ldo + j] = sum_h w[t, h] * relu(q[t, h] . row_j) for the n (1..64) rows of the chunk;
    // the next chunk's next_n rows of next_bytes each are fetched toward the core meanwhile (the
    // blocks lie anywhere in the cache, where the hardware prefetcher cannot follow).
    void chunk(const void* const* rows, DecodeRowKind kind, int64_t n, float* out, int64_t ldo,
               const void* const* next = nullptr, int64_t next_n = 0, int64_t next_bytes = 0);
    void end();  // releases the tiles

private:
    int64_t tokens_ = 0, heads_ = 0, d_ = 0, groups_ = 0;
    LineVector<uint16_t> qt_, kb_;
    LineVector<float> st_, acc_;
    std::vector<float> w_;
};

}  // namespace mla
