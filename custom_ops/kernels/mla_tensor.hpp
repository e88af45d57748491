// A framework-neutral view of one op input or output, and the error type every check throws.
// The OpenVINO and onnxruntime wrappers both translate their tensors into this, so the kernels
// and their validation are written once.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace mla {

enum class DType { f32, bf16, f16, i32, i64, u8, other };

const char* dtype_name(DType t);


struct TensorView {
    const char* name = "";        // the input's name in the op signature, used in error messages
    void* data = nullptr;
    DType dtype = DType::other;
    std::vector<int64_t> shape;

    int64_t rank() const { return static_cast<int64_t>(shape.size()); }
    int64_t dim(int64_t i) const { return shape.at(static_cast<size_t>(i)); }
    int64_t numel() const {
        int64_t n = 1;
        for (auto d : shape) n *= d;
        return n;
    }
    template <typename T> T* ptr() const { return static_cast<T*>(data); }
};

// Every validation failure: the message names the op, the input and the bad value.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Runs body(i) for i in [0, n), possibly on several threads. Each wrapper passes its own
// runtime's pool (OpenVINO: ov::parallel_for, which honours INFERENCE_NUM_THREADS).
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t)>& body)>;

// Serial fallback, for tests and small problems.
void serial_for(int64_t n, const std::function<void(int64_t)>& body);

// The number of threads the parallel-for will use (to size the split of long contexts).
struct Threading {
    ParallelFor parallel_for = serial_for;
    int num_threads = 1;
};

// Runs body(i) for i in [0, n) on up to num_threads workers that take the next index from a
// shared counter as they finish: the pools partition statically (ov::parallel_for is TBB with a
// static partitioner), so uneven tasks, or a core taken by another process, would otherwise
// hold the whole call back. Run the largest tasks first.
void dynamic_for(const Threading& th, int64_t n, const std::function<void(int64_t)>& body);

}  // namespace mla
