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

// The cache as rows of its logical dtype. A u8 cache [NB, BS, 2 * W] holds bf16 rows as raw
// bytes: OpenVINO's CPU plugin converts a bf16 input of a custom op into an f32 copy on CPUs
// without native bf16 (so it could not be written in place), but passes u8 through untouched.
TensorView as_cache_rows(const char* op, const TensorView& kv_cache);

// Reads element i of an i32 or i64 tensor.
int64_t index_at(const TensorView& t, int64_t i);

// seq_lens [B] and block_tables [B, M]: every length in [min_len, M * BS] and every block id a
// sequence uses (the first ceil(len / BS) of its row) in [0, NB). Unused table entries are
// padding and are not read.
void check_block_tables(const char* op, const TensorView& block_tables, const TensorView& seq_lens,
                        const TensorView& kv_cache, int64_t batch, int64_t min_len);

}  // namespace mla
