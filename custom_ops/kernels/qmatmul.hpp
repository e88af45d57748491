// Products of activation rows with integer weight rows (qgemm.hpp's layout): the one tile routine
// the fused MoE op and the quantized linear op share.
//
// A tile is 32 weight rows (8 blocks of 4) against m activation rows. Under the reduced-precision
// mode on AVX2 and AVX-512 VNNI CPUs: dot products on the codes with int8 activations, for any m. In f32: dot
// products on the codes for few rows (decode: one pass over the weights); for many (prefill) a
// panel of the 32 rows is dequantised once per k-block and every activation row runs dot products
// against it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "aligned_vector.hpp"

#include "mla_tensor.hpp"
#include "qgemm.hpp"
#include "weight_format.hpp"

namespace mla {

constexpr int64_t kTileRows = 32;   // weight rows per tile

// From how many activation rows a tile dequantises its panel once instead of running dot products
// on the codes: 8 in f32. On int8 activations never: their (VNNI) dots, two 4-row blocks by 4 rows
// of x a call, ran 1.4-1.75x faster than bf16 panels at every row count measured (64 to 2048 rows
// of a 10944 x 2048 projection, int8 and int4 weights, 2 cores), and ahead of the CPU plugin's
// compressed MatMul at 512 rows, as llama.cpp runs its prompts on int8 activations too. The AVX2
// table's (vpmaddubsw) ran a 1024-token prefill of the 3-layer V2-Lite int8 export in ~3 s where
// its f32 panels had taken ~40 s (Zen 3, 2 cores; the panels' fdot then spilled its registers).
constexpr int64_t kManyRows = 8;
// From how many int8 activation rows a tile runs on AMX-INT8 tiles where the CPU has them
// (qmatmul_amx.hpp): 8, a decode batch of 8. Measured on the 102400 x 2048 lm_head (2 cores,
// cold weights, alternated runs, ms VNNI dots -> tiles): int8 5 rows 10.6-10.8 -> 11.3-11.6,
// 6 rows 11.3-16.8 -> 11.1-12.6, 8 rows 12.9-13.1 -> 12.3-12.4, 12 rows 15.9-17.3 -> 13.9-14.3;
// int4 8 rows 11.5-11.7 -> 8.4-9.5. The 3-layer V2-Lite int8 decode step at batch 8: 66-70 ->
// 64.3-64.9 ms. (Small projections whose weights stay in cache, e.g. 2048 x 2048 at 8 rows, are
// ~25% slower on the tiles: their per-call re-layout is not hidden behind memory reads.)
constexpr int64_t kAmxRows = 8;
constexpr int64_t kNeverMany = INT64_MAX;
// From how many rows QActs quantises them on every thread (one row is microseconds: decode's few
// rows stay on the calling thread).
constexpr int64_t kParallelQuantizeRows = 32;
// MlaQLinear's rows per work item when they are many (its panels are dequantised once per block).
#ifndef MLA_QLINEAR_ROW_BLOCK
#define MLA_QLINEAR_ROW_BLOCK 256
#endif
constexpr int64_t kQLinearRowBlock = MLA_QLINEAR_ROW_BLOCK;

// How products run: exact f32, or the runtime's reduced precision (compute = bf16): int8
// activations with the AVX2 table (vpmaddubsw) and the AVX-512 one on VNNI CPUs (every CPU with
// AVX512_BF16 has AVX512_VNNI too), else f32 (the portable table).
struct QMode {
    bool q8_dots = false;
    bool fp8_bf16 = false;  // fp8 codes against bf16 activations (QgemmIsa::qdot_fp8_bf16)
    bool fp8_lines = false;  // ... at every row count: the codes widened once by lookups (widen_fp8_lines)
};
QMode qmode(bool reduced, const QgemmIsa& isa);
// The mode of a projection in fp8 codes: bf16 dots under the reduced precision where the table has
// them and the CPU has AVX512_BF16, else f32 dots (never int8 activations).
QMode qmode_fp8(bool reduced, const QgemmIsa& isa);
// fp8 codes on bf16 rows: with the codes widened by shifts, dots up to 16 rows (2-4 passes over a
// tile whose 64 KB of codes stay in L2), f32 panels from there. With the VBMI lookups (fp8_lines)
// never panels: each 4-row block's codes are widened once into bf16 lines that 8-row passes of
// bf16 dots read (32 multiply-adds an instruction where the f32 panels' FMAs do 16). Measured on
// one 21888 x 2048 MlaQLinear, 1024 rows, 2 threads, Zen 4, against int8 (VNNI): f32 panels
// 2.85-4.0x int8's time, the lookup dots widening every pass 2.1-2.2x.
constexpr int64_t kManyRowsFp8Bf16 = 16;
inline int64_t many_rows(const QMode& mode) {
    return mode.q8_dots || mode.fp8_lines ? kNeverMany : mode.fp8_bf16 ? kManyRowsFp8Bf16 : kManyRows;
}

// The weights of one projection: codes [rows, in / per_byte] (4-row interleaved), scales and zero
// points [rows, groups]. Several experts' projections stack along rows.
struct QWeights {
    const uint8_t* q;
    const float* s;
    const uint8_t* zp;
    int64_t row_bytes, groups;
    QBlock block(int64_t r0) const;  // rows r0..r0+3, r0 % 4 == 0
};

// Checks one projection's codes/scales/zero points, [E, rows, in / per_byte] u8, [E, rows, G] f32
// and [E, rows, G] u8 (experts >= 1; experts = 0: rank 2, no expert axis), naming the bad input
// in op's error; returns the group size (in / G, a multiple of 32). int4 zero points must be <= 15:
// scanned here unless zp_checked (the OpenVINO ops scan their Constant zero points once, when the
// graph is built, instead of on every call, where the scan costs a few percent of a decode step).
int64_t check_qweights(const char* op, const TensorView& q, const TensorView& s, const TensorView& zp, int64_t experts,
                       int64_t rows, int64_t in, int64_t bits, bool zp_checked);
void check_int4_zero_points(const char* op, const TensorView& zp);  // every code <= 15, else mla::Error

// Activation rows [n, K] prepared once in the forms the tiles read: f32 rows and their group sums
// (for f32 dots; panels read the rows), or int8 rows (want_q8 under the q8 mode).
class QActs {
public:
    QActs(const float* x, int64_t n, int64_t K, int64_t group, QMode mode, bool want_q8, const QgemmIsa& isa,
          const Threading& th);
    const float* row(int64_t i) const { return x_ + i * K_; }
    const float* sums(int64_t i) const { return sums_.data() + i * G_; }
    QRow q8(int64_t i) const;
    bool has_q8() const { return !q_.empty(); }
    const uint16_t* bf16(int64_t i) const { return b_.data() + i * K_; }
    bool has_bf16() const { return !b_.empty(); }

private:
    const float* x_;
    int64_t K_, G_, block_ = 32;
    std::vector<float> sums_;
    LineVector<int8_t> q_;  // row i at i * K: line-aligned A tiles when K % 64 == 0
    std::vector<uint16_t> b_;  // bf16 rows (want_q8 under the fp8_bf16 mode)
    std::vector<float> d_, gsum_;
};

// body(i) for i in [0, n), each worker taking one contiguous run of indices: for weight streams
// of uniform cost per index (decode), so each core reads one long run of memory that its hardware
// prefetcher follows (handing out interleaved items made both cores' streams jump: lm_head-sized
// int8 streams went from ~23 to ~36 GB/s on 2 cores). Uneven work (prefill) keeps dynamic_for.
void split_for(const Threading& th, int64_t n, const std::function<void(int64_t)>& body);
// The same split, each worker given its run [begin, end) whole (to walk it in its own order).
void split_ranges(const Threading& th, int64_t n, const std::function<void(int64_t, int64_t)>& body);

// c[t * 32 + r] = act(rows[t]) . w_r for the m activation rows `rows` (indices into acts) and the
// 32 weight rows of `blocks`. bits_index: 0 = int8 codes, 1 = int4. Dot products on the codes for
// m below many_from (the caller's many_rows bound; acts must hold the int8 or f32 rows they read),
// dequantised panels from there. few_nb (1 or 2): 4-row blocks per int8 dot call at 1-2 rows, 2 when
// blocks[2j] and blocks[2j + 1] are two separate streams worth reading side by side (the MoE's gate
// and up rows).
void qtile(const QgemmIsa& isa, int bits_index, const QActs& acts, const int64_t* rows, int64_t m,
           const QBlock* blocks, int64_t K, int64_t group, float* c, int64_t many_from, int few_nb = 1);

// The tile16 layout of int8, int4 and fp8 codes (MlaQLinear's and MlaMoeExperts' `layout = "tile16"`;
// the runtime writes it on VNNI CPUs for int8 and int4, on AVX512-BF16 + VBMI CPUs without AMX for
// fp8: mla_export/runtime/qlinear_tiles.py): rows in tiles of 16, and within a tile bytes 4j..4j+3
// of its 16 rows in one 64-byte line, row r at bytes 4r..4r+3: row 16i + r, byte 4j + e of the row
// at byte 16i * B + 64j + 4r + e (B: a row's bytes, K or K / 2). For int8 and fp8 a line holds
// inputs 4j..4j+3; int4 bytes keep their 4-row layout's pairs (qgemm.hpp: byte j of a 16-byte chunk
// holds inputs j and 16 + j), so a line's low nibbles are 4 inputs and its high ones the 4 inputs 16
// further. A 32-row tile of qtile() spans the same bytes in either layout (32 * B from its first
// row), only their order differs. The 16 lines of inputs 64s..64s+63 of a 16-row int8 tile are an
// AMX-INT8 B tile as it lies (qmatmul_amx.hpp).
// The per-group scales and zero points ([rows, groups]) lie in tiles too: a tile's 16 factors of
// group g side by side (tile16_factor), so a kernel loads a group's 16 with one load where row-major
// factors took 16 scalar loads a group and tile (int4 in groups of 128, 1 token: 0.83-0.97x the 4-row
// layout's time with them, level without). A tile's factors start where its first row's did
// (row * groups); per-channel factors (one group) are the same in both orders.
inline int64_t tile16_factor(int64_t row, int64_t g, int64_t groups) {
    return (row / 16) * 16 * groups + 16 * g + row % 16;
}
constexpr int64_t kTile16Rows = 16;
// Whether tile16 codes run their own int8 dots here (the table has them and the mode is q8).
inline bool tile16_dots(const QgemmIsa& isa, const QMode& mode) { return mode.q8_dots && isa.qdot_q8_t16[0][0][0] != nullptr; }
// c[t * 32 + r] as qtile's, for 32 rows of tile16 int8 (bits_index 0) or int4 (1) codes: the 16-row
// tile at q (s, zp: its first row's groups) and the one `step` rows after it (16: the next one; an
// MoE expert's up tile, its intermediate size after the gate's), on int8 activation rows
// (tile16_dots, acts.has_q8()).
// paired: 1-2 activation rows read both tiles in one pass (two streams side by side, the MoE's
// gate and up: 1 token 1.09-1.22x the 4-row layout's paired blocks) instead of one after the other.
void qtile16(const QgemmIsa& isa, int bits_index, const QActs& acts, const int64_t* rows, int64_t m, const uint8_t* q, const float* s,
             const uint8_t* zp, int64_t groups, int64_t K, int64_t group, float* c, int64_t step = kTile16Rows,
             bool paired = false);
// Whether fp8 codes in the tile16 layout run their own bf16 dots here (qdot_fp8_t16: the mode's
// bf16 dots with the lookups, fp8_codes=lut).
bool tile16_fp8_dots(const QgemmIsa& isa, const QMode& mode);
// Whether codes of this format (bits) in the tile16 layout run their own dots here on acts: int8's
// and int4's tile16_dots on int8 rows, fp8's tile16_fp8_dots on bf16 rows (else a 4-row view of each tile).
inline bool tile16_runs(const QgemmIsa& isa, int64_t bits, const QMode& mode, const QActs& acts) {
    return bits == kFp8Bits ? tile16_fp8_dots(isa, mode) && acts.has_bf16() : tile16_dots(isa, mode) && acts.has_q8();
}
// qtile16 for fp8 codes on bf16 activation rows (tile16_fp8_dots, acts.has_bf16()); no zero points.
void qtile16_fp8(const QgemmIsa& isa, const QActs& acts, const int64_t* rows, int64_t m, const uint8_t* q,
                 const float* s, int64_t groups, int64_t K, int64_t group, float* c, int64_t step = kTile16Rows);
// rows (a multiple of 16) of tile16 codes at src, row_bytes each, rewritten in the 4-row layout at dst
// (rows * row_bytes bytes): where tile16 codes meet a kernel of the 4-row layout (f32, AVX2, the
// portable table).
void tile16_to_rows4(const uint8_t* src, int64_t rows, int64_t row_bytes, uint8_t* dst);
// Scratch of a rows4_view: the codes, scales and zero points of the rows it views.
struct Rows4Scratch {
    LineVector<uint8_t> q;
    std::vector<float> s;
    std::vector<uint8_t> zp;
};
// The 4-row layout's view of w's `rows` tile16 rows from `row` (rows a multiple of 16): their codes,
// scales and zero points rewritten into scratch (factors row-major); block(0) holds rows row..row+3.
QWeights rows4_view(const QWeights& w, int64_t row, int64_t rows, Rows4Scratch& scratch);
// c[t * 32 + r] for the 32 rows of w from `row` (a work item) in whichever layout its codes lie:
// tile16 (the op's layout attribute) on the tile16 dots where t16_dots (int8, int4: tile16_dots() and
// acts.has_q8(); fp8: tile16_fp8_dots() and acts.has_bf16()), else qtile over the 4-row layout (a
// tile16 item through its rows4_view); bits_index and many_from as qtile's.
void qtile_at(const QgemmIsa& isa, int bits_index, const QActs& acts, const int64_t* rows, int64_t m, const QWeights& w,
              int64_t row, bool tile16, bool t16_dots, int64_t K, int64_t group, float* c, int64_t many_from);

}  // namespace mla
