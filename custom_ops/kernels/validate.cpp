#include "validate.hpp"

#include <sstream>

#include "compute.hpp"

namespace mla {

std::string shape_str(const std::vector<int64_t>& shape) {
    std::ostringstream s;
    s << "[";
    for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
    s << "]";
    return s.str();
}

void fail(const char* op, const TensorView& t, const std::string& what) {
    throw Error(std::string(op) + ": input '" + t.name + "' " + what);
}

void check_rank(const char* op, const TensorView& t, int64_t rank) {
    if (t.rank() != rank)
        fail(op, t, "must have rank " + std::to_string(rank) + ", got shape " + shape_str(t.shape));
    for (auto d : t.shape)
        if (d < 0) fail(op, t, "has a negative dimension " + shape_str(t.shape));
}

void check_dim(const char* op, const TensorView& t, int64_t axis, int64_t expected, const char* why) {
    if (t.dim(axis) != expected)
        fail(op, t, "dimension " + std::to_string(axis) + " must be " + std::to_string(expected) +
                        " (" + why + "), got shape " + shape_str(t.shape));
}

void check_float(const char* op, const TensorView& t) {
    if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16)
        fail(op, t, std::string("must be f32, bf16 or f16, got ") + dtype_name(t.dtype));
    if (t.numel() > 0 && t.data == nullptr) fail(op, t, "has no data");
}

void check_index(const char* op, const TensorView& t) {
    if (t.dtype != DType::i32 && t.dtype != DType::i64)
        fail(op, t, std::string("must be i32 or i64, got ") + dtype_name(t.dtype));
    if (t.numel() > 0 && t.data == nullptr) fail(op, t, "has no data");
}

void check_cache(const char* op, const TensorView& c, bool writable) {
    check_rank(op, c, 3);
    if (writable && c.dtype != DType::f32 && c.dtype != DType::bf16 && c.dtype != DType::f16)
        fail(op, c, std::string("must be f32, bf16 or f16 to be written in place, got ") + dtype_name(c.dtype));
    check_float(op, c);
    if (c.dim(1) < 1) fail(op, c, "must have a block size of at least 1, got shape " + shape_str(c.shape));
    if (c.dim(2) < 2) fail(op, c, "must have a row width of at least 2, got shape " + shape_str(c.shape));
}

int64_t index_at(const TensorView& t, int64_t i) {
    return t.dtype == DType::i32 ? static_cast<int64_t>(t.ptr<const int32_t>()[i]) : t.ptr<const int64_t>()[i];
}

void check_block_tables(const char* op, const TensorView& bt, const TensorView& seq_lens,
                        const TensorView& cache, int64_t batch, int64_t min_len) {
    check_index(op, bt);
    check_index(op, seq_lens);
    check_rank(op, bt, 2);
    check_rank(op, seq_lens, 1);
    check_dim(op, seq_lens, 0, batch, "the batch size");
    check_dim(op, bt, 0, batch, "the batch size");
    const int64_t nb = cache.dim(0), bs = cache.dim(1), m = bt.dim(1);
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t len = index_at(seq_lens, b);
        if (len < min_len || len > m * bs)
            fail(op, seq_lens, "holds " + std::to_string(len) + " at [" + std::to_string(b) +
                                   "], outside [" + std::to_string(min_len) + ", " +
                                   std::to_string(m * bs) + "] (block_tables width " + std::to_string(m) +
                                   " x block size " + std::to_string(bs) + ")");
        const int64_t used = (len + bs - 1) / bs;
        for (int64_t j = 0; j < used; ++j) {
            const int64_t blk = index_at(bt, b * m + j);
            if (blk < 0 || blk >= nb)
                fail(op, bt, "holds block id " + std::to_string(blk) + " at [" + std::to_string(b) + ", " +
                                 std::to_string(j) + "], outside [0, " + std::to_string(nb) +
                                 ") (the number of blocks of kv_cache)");
        }
    }
}

int64_t check_new_tokens(const char* op, const TensorView& qsl, const TensorView& seq_lens, const TensorView& bt,
                         const TensorView& cache, int64_t t_count, const char* tokens_of) {
    check_index(op, qsl);
    check_rank(op, qsl, 1);
    if (qsl.dim(0) < 1) fail(op, qsl, "must have B + 1 >= 1 entries, got shape " + shape_str(qsl.shape));
    const int64_t batch = qsl.dim(0) - 1;
    check_block_tables(op, bt, seq_lens, cache, batch, /*min_len=*/0);
    if (index_at(qsl, 0) != 0) fail(op, qsl, "must start at 0, got " + std::to_string(index_at(qsl, 0)));
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t qlen = index_at(qsl, b + 1) - index_at(qsl, b);
        if (qlen < 0)
            fail(op, qsl, "must be non-decreasing, got " + std::to_string(index_at(qsl, b)) + " then " +
                              std::to_string(index_at(qsl, b + 1)) + " at [" + std::to_string(b) + "]");
        if (qlen > index_at(seq_lens, b))
            fail(op, qsl, "gives sequence " + std::to_string(b) + " " + std::to_string(qlen) +
                              " new tokens, more than its seq_lens " + std::to_string(index_at(seq_lens, b)));
    }
    if (index_at(qsl, batch) != t_count)
        fail(op, qsl, "must end at T = " + std::to_string(t_count) + " (tokens of " + tokens_of + "), got " +
                          std::to_string(index_at(qsl, batch)));
    return batch;
}

Compute compute_from_name(const char* op, const std::string& name) {
    if (name == "f32") return Compute::f32;
    if (name == "bf16") return Compute::bf16;
    throw Error(std::string(op) + ": attribute 'compute' must be f32 or bf16, got '" + name + "'");
}

}  // namespace mla
