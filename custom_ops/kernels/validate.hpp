// Input checks shared by the three ops. Each throws mla::Error with a message of the form
// "<Op>: input '<name>' <what is wrong> (<the bad value>)".
#pragma once

#include <string>

#include "mla_tensor.hpp"

namespace mla {

std::string shape_str(const std::vector<int64_t>& shape);

[[noreturn]] void fail(const char* op, const TensorView& t, const std::string& what);

void check_rank(const char* op, const TensorView& t, int64_t rank);
void check_dim(const char* op, const TensorView& t, int64_t axis, int64_t expected, const char* why);
void check_float(const char* op, const TensorView& t);      // f32, bf16 or f16
void check_index(const char* op, const TensorView& t);      // i32 or i64
void check_cache(const char* op, const TensorView& kv_cache, bool writable);

// Reads element i of an i32 or i64 tensor.
int64_t index_at(const TensorView& t, int64_t i);

// seq_lens [B] and block_tables [B, M]: every length in [min_len, M * BS] and every block id a
// sequence uses (the first ceil(len / BS) of its row) in [0, NB). Unused table entries are
// padding and are not read.
void check_block_tables(const char* op, const TensorView& block_tables, const TensorView& seq_lens,
                        const TensorView& kv_cache, int64_t batch, int64_t min_len);

// query_start_loc [B + 1] against seq_lens and block_tables (check_block_tables, min_len 0) and
// T packed new tokens (of input `tokens_of`): starts at 0, non-decreasing, at most seq_lens[b] new
// tokens per sequence, ends at T. Returns B.
int64_t check_new_tokens(const char* op, const TensorView& query_start_loc, const TensorView& seq_lens,
                         const TensorView& block_tables, const TensorView& cache, int64_t t_count,
                         const char* tokens_of);

}  // namespace mla
