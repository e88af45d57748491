// MlaStepCheck: the whole step's metadata checked once, before any layer runs.
//
// Each MLA op validates its own inputs, but in a graph the ops run layer by layer: a bad
// block_tables entry was only seen by layer 0's attention, after layer 0's cache write had run,
// and inputs no MLA op reads (input_ids, positions, logits_indices) were not checked at all
// (Gather wraps or zero-fills out-of-range indices: silent wrong answers). This op sits at the
// graph's start; input_ids, positions and slot_mapping reach the rest of the graph only through
// its outputs, so every cache write and every read depends on it, and a step is accepted or
// rejected as a whole before any cache byte moves.
//
// The rule it enforces is the metadata builder's (mla_export/runtime/metadata.py): for new token
// j of sequence b (qlen_b = query_start_loc[b + 1] - query_start_loc[b] >= 1),
//   position = seq_lens[b] - qlen_b + j            (positions must hold exactly that)
//   slot     = block_tables[b, pos / BS] * BS + pos % BS   (slot_mapping must hold exactly that)
// so a token is written into a block of its own sequence at its own position, and
// logits_indices (L >= B rows, strictly increasing, inside [0, T)) picks at least one row of
// every sequence's own new tokens: one per sequence (its last token) for sampling, every new
// token of a sequence whose prompt logprobs are wanted.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "mla_kernels.hpp"
#include "validate.hpp"

namespace mla {

static const char* kOp = "MlaStepCheck";

static std::string at(int64_t i) { return "[" + std::to_string(i) + "]"; }

void step_check(const StepInputs& in, const std::vector<TensorView>& caches, int64_t vocab_size,
                int64_t max_positions) {
    const TensorView* meta[] = {&in.input_ids, &in.positions, &in.slot_mapping, &in.query_start_loc,
                                &in.seq_lens, &in.block_tables, &in.logits_indices};
    for (const TensorView* t : meta) {
        check_index(kOp, *t);
        check_rank(kOp, *t, t == &in.block_tables ? 2 : 1);
    }
    const int64_t tokens = in.input_ids.dim(0), batch = in.seq_lens.dim(0);
    check_dim(kOp, in.positions, 0, tokens, "the number of tokens T of input_ids");
    check_dim(kOp, in.slot_mapping, 0, tokens, "the number of tokens T of input_ids");
    if (batch < 1) fail(kOp, in.seq_lens, "must hold at least one sequence, got shape " + shape_str(in.seq_lens.shape));
    check_dim(kOp, in.query_start_loc, 0, batch + 1, "the number of sequences B of seq_lens, plus 1");
    if (in.logits_indices.dim(0) < batch)
        fail(kOp, in.logits_indices, "must hold at least one row per sequence (B = " + std::to_string(batch) +
                                         "), got shape " + shape_str(in.logits_indices.shape));

    // The caches: one per layer, all of one shape and dtype (a layer with a smaller cache would
    // fail only when its turn came, after the layers before it had written).
    // Only the block count and block size matter here: the row format (f32, bf16/f16 bytes,
    // quantised rows) is the attention and write ops' business.
    if (caches.empty()) throw Error(std::string(kOp) + ": no kv_cache input");
    const TensorView& c0 = caches[0];
    check_rank(kOp, c0, 3);
    if (c0.dim(1) < 1) fail(kOp, c0, "must have a block size of at least 1, got shape " + shape_str(c0.shape));
    for (size_t i = 1; i < caches.size(); ++i) {
        if (caches[i].dtype != caches[0].dtype || caches[i].shape != caches[0].shape)
            fail(kOp, caches[i], std::string("must have the dtype and shape of ") + caches[0].name + " (" +
                                     dtype_name(caches[0].dtype) + " " + shape_str(caches[0].shape) + "), got " +
                                     dtype_name(caches[i].dtype) + " " + shape_str(caches[i].shape));
    }
    const int64_t bs = c0.dim(1);

    // query_start_loc: 0, strictly increasing (every sequence has a new token, whose logits row
    // is returned), ending at T.
    if (index_at(in.query_start_loc, 0) != 0)
        fail(kOp, in.query_start_loc, "must start at 0, got " + std::to_string(index_at(in.query_start_loc, 0)));
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t lo = index_at(in.query_start_loc, b), hi = index_at(in.query_start_loc, b + 1);
        if (hi <= lo)
            fail(kOp, in.query_start_loc, "must be strictly increasing (every sequence has a new token), got " +
                                              std::to_string(lo) + " then " + std::to_string(hi) + " at " + at(b + 1));
        const int64_t len = index_at(in.seq_lens, b);
        if (len < hi - lo)
            fail(kOp, in.seq_lens, "holds " + std::to_string(len) + " at " + at(b) + ", fewer than the " +
                                       std::to_string(hi - lo) + " new tokens query_start_loc gives the sequence");
        if (len > max_positions)
            fail(kOp, in.seq_lens, "holds " + std::to_string(len) + " at " + at(b) + ", beyond the model's " +
                                       std::to_string(max_positions) + " positions (its RoPE table)");
    }
    if (index_at(in.query_start_loc, batch) != tokens)
        fail(kOp, in.query_start_loc, "must end at the number of tokens T = " + std::to_string(tokens) +
                                          " of input_ids, got " + std::to_string(index_at(in.query_start_loc, batch)));
    // Lengths within the tables and every block a sequence uses inside the cache.
    check_block_tables(kOp, in.block_tables, in.seq_lens, c0, batch, /*min_len=*/1);

    for (int64_t t = 0; t < tokens; ++t) {
        const int64_t id = index_at(in.input_ids, t);
        if (id < 0 || id >= vocab_size)
            fail(kOp, in.input_ids, "holds token id " + std::to_string(id) + " at " + at(t) + ", outside [0, " +
                                        std::to_string(vocab_size) + ") (the vocabulary)");
    }

    // Positions and slots: each token's exact ones. Written slots are then distinct within a
    // sequence (distinct positions); across sequences, no two write into one block (below).
    const int64_t m = in.block_tables.dim(1);
    std::vector<int64_t> written(static_cast<size_t>(tokens));
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t lo = index_at(in.query_start_loc, b), hi = index_at(in.query_start_loc, b + 1);
        const int64_t past = index_at(in.seq_lens, b) - (hi - lo);
        for (int64_t t = lo; t < hi; ++t) {
            const int64_t pos = past + (t - lo);
            if (index_at(in.positions, t) != pos)
                fail(kOp, in.positions, "holds " + std::to_string(index_at(in.positions, t)) + " at " + at(t) +
                                            ", but token " + std::to_string(t - lo) + " of sequence " +
                                            std::to_string(b) + " is at position " + std::to_string(pos) +
                                            " (seq_lens - new tokens + its index)");
            const int64_t blk = index_at(in.block_tables, b * m + pos / bs), slot = blk * bs + pos % bs;
            if (index_at(in.slot_mapping, t) != slot)
                fail(kOp, in.slot_mapping, "holds slot " + std::to_string(index_at(in.slot_mapping, t)) + " at " +
                                               at(t) + ", but token " + std::to_string(t - lo) + " of sequence " +
                                               std::to_string(b) + " (position " + std::to_string(pos) +
                                               ") belongs in slot " + std::to_string(slot) + " (block_tables[" +
                                               std::to_string(b) + ", " + std::to_string(pos / bs) + "] = " +
                                               std::to_string(blk) + ")");
            written[static_cast<size_t>(t)] = slot;
        }
    }
    // logits_indices: strictly increasing rows of [0, T), at least one inside each sequence's
    // new tokens (so every sequence gets the logits it samples from, and no row is returned twice).
    const int64_t rows = in.logits_indices.dim(0);
    for (int64_t k = 0; k < rows; ++k) {
        const int64_t li = index_at(in.logits_indices, k);
        if (li < 0 || li >= tokens)
            fail(kOp, in.logits_indices, "holds " + std::to_string(li) + " at " + at(k) + ", outside the step's " +
                                             std::to_string(tokens) + " tokens");
        if (k > 0 && li <= index_at(in.logits_indices, k - 1))
            fail(kOp, in.logits_indices, "must be strictly increasing, got " +
                                             std::to_string(index_at(in.logits_indices, k - 1)) + " then " +
                                             std::to_string(li) + " at " + at(k));
    }
    for (int64_t b = 0, k = 0; b < batch; ++b) {
        const int64_t lo = index_at(in.query_start_loc, b), hi = index_at(in.query_start_loc, b + 1);
        while (k < rows && index_at(in.logits_indices, k) < lo) ++k;
        if (k == rows || index_at(in.logits_indices, k) >= hi)
            fail(kOp, in.logits_indices, "picks no row of sequence " + std::to_string(b) + "'s tokens [" +
                                             std::to_string(lo) + ", " + std::to_string(hi) + ")");
    }
    // A block written this step belongs to its writer alone: another sequence that reads it (a
    // shared prefix block that should have been copied first) would see the writer's new rows.
    std::vector<std::pair<int64_t, int64_t>> writers;  // (block, sequence), sorted
    writers.reserve(static_cast<size_t>(tokens));
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t t = index_at(in.query_start_loc, b); t < index_at(in.query_start_loc, b + 1); ++t)
            writers.emplace_back(written[static_cast<size_t>(t)] / bs, b);
    std::sort(writers.begin(), writers.end());
    writers.erase(std::unique(writers.begin(), writers.end()), writers.end());
    for (size_t k = 1; k < writers.size(); ++k)
        if (writers[k].first == writers[k - 1].first)
            fail(kOp, in.block_tables, "gives block " + std::to_string(writers[k].first) + " to sequences " +
                                           std::to_string(writers[k - 1].second) + " and " +
                                           std::to_string(writers[k].second) + ", which both write into it");
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t used = (index_at(in.seq_lens, b) + bs - 1) / bs;
        for (int64_t j = 0; j < used; ++j) {
            const int64_t blk = index_at(in.block_tables, b * m + j);
            auto it = std::lower_bound(writers.begin(), writers.end(), std::make_pair(blk, int64_t(-1)));
            if (it != writers.end() && it->first == blk && it->second != b)
                fail(kOp, in.block_tables, "gives block " + std::to_string(blk) + " to sequence " + std::to_string(b) +
                                               " at [" + std::to_string(b) + ", " + std::to_string(j) +
                                               "], but sequence " + std::to_string(it->second) +
                                               " writes into it in this step");
        }
    }
}

}  // namespace mla
