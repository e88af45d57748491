// The absorbed form's two products for single-token (decode) rows on AMX bf16 tiles: scores
// q . k over the 576-wide cache rows and the probability-weighted sum of their first r columns.
// Used only under compute "bf16" (the runtime's bf16 hint) on CPUs with AMX-BF16 and
// AVX512-BF16 (Sapphire Rapids and later Xeons); CPUs with AVX512-BF16 alone take the same
// products in vector dot products (attention_bf16.hpp); everything else keeps the f32 kernels of
// isa_impl.hpp, which stay the exact path.
//
// Why the layouts: a tile product C[16 x 16] += A[16 x 32 bf16] . B[16 pairs x 16 x 2 bf16]
// reduces over pairs of adjacent values of B's columns. The scores are computed transposed,
// S^T = K . Q^T: the cache rows are the A tiles as they lie (a bf16 cache's block of 16 rows is
// read in place; other formats and split groups are converted to bf16 once per chunk, shared by
// every head), Q^T's pair layout is built once per task, and the softmax runs with the 16 query
// rows in the 16 lanes of a vector. P . V also takes V's rows as they lie, as B tiles: P enters
// with each probability in the low, then in the high half of its pair (the other half zero), so
// the two products give V's even and odd columns. On this hardware the tile loads and stores,
// not the products, are what a chunk costs (a load ~40 cycles from L1, a product ~14): a copy of
// V with its rows' values interleaved (the usual B layout) cost more in stores than the doubled
// products do.
#pragma once

#include <cstdint>
#include <vector>

#include "aligned_vector.hpp"
#include "decode_rows.hpp"

namespace mla {

// Online-softmax attention state of m query rows over chunks of at most 64 cache rows, each
// visible to every query row (single-token decode). One per task, reused across calls.
class AmxDecodeRows {
public:
    static constexpr int64_t kRows = 64;   // cache rows per chunk
    static constexpr int64_t kGroups = 4;  // of 16 rows: one A tile each
    // q [m, w] f32 rows; w % 32 == 0, r % 64 == 0, r < w.
    void begin(const float* q, int64_t m, int64_t w, int64_t r);
    using Rows = DecodeRowKind;  // what chunk() reads (decode_rows.hpp)
    // n (1..64) cache rows of width w in the given element type; the next chunk's next_n rows
    // (none: 0) are fetched toward the core meanwhile, as the f32 kernels' PrefetchStream does.
    void chunk(const void* const* rows, Rows kind, int64_t n, float scale, const void* const* next = nullptr,
               int64_t next_n = 0);
    // The state of the m rows: running max, sum of exponentials, unnormalised output [m, r] (ldo).
    void end(float* mx, float* l, float* o, int64_t ldo);

private:
    int64_t m_ = 0, w_ = 0, r_ = 0, groups_ = 0;
    LineVector<uint16_t> qt_, kb_;  // tile operands and results: rows on whole cache lines
    LineVector<uint32_t> pe_, po_;
    LineVector<float> st_, ot_;
    std::vector<float> mx_, l_;
};

// C[m, n] = A[m, k] . W[k, n] on AMX bf16 tiles, W bf16 row-major (ldw), A f32 rows (rounded to
// bf16), C f32 rows: the absorbed form's up-projections (q_nope . W_UK, o_lat . W_UV) of a decode
// run. W's rows are the B tiles as they lie (16 rows of k a tile at the row stride: no copy of the
// weights), so, as in P . V above, A enters as the low and the high halves of its pairs and the two
// products give C's even and odd columns. Needs n % 64 == 0 and k % 16 == 0 (amx_up_project_fits).
// Loads its own tile configuration (rows of A and C: up to 16 tokens) and releases the tiles.
bool amx_up_project_fits(int64_t n, int64_t k);
void amx_up_project(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* w, int64_t ldw,
                    float* c, int64_t ldc);

}  // namespace mla
