// Each op's run function: the table's last column. The adapters (OpenVINO, onnxruntime) hand a
// call its inputs as views named by the table, its checked attributes, a way to make outputs,
// the runtime's threads and the op object's workspace; the run function plans (the kernels
// validate every input, naming it), sizes the outputs and runs. Nothing here knows a runtime.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "../kernels/mla_kernels.hpp"
#include "op_table.hpp"

namespace mla::ops {

struct OpCall {
    const OpSpec& op;
    const AttrValues& attrs;
    std::vector<TensorView> inputs;  // one per input given; an optional one left out has no data
    // Output k of the given shape, allocated by the runtime (its element type is the table's).
    std::function<TensorView(size_t k, const std::vector<int64_t>& shape)> output;
    Threading threading;
    OpWorkspace* workspace;
    bool zero_points_checked = false;  // the int4 zero points were scanned once (as constants)

    bool given(size_t i) const { return i < inputs.size() && inputs[i].data != nullptr; }
    float f(const char* attr) const { return attr_f(op, attrs, attr); }
    int64_t i(const char* attr) const { return attr_i(op, attrs, attr); }
    const std::string& s(const char* attr) const { return attr_s(op, attrs, attr); }
};

using ZeroPointInputs = std::vector<std::pair<size_t, const char*>>;

struct OpRun {
    void (*run)(OpCall& call);
    // Rules across attributes that the table cannot say (nullptr: none); throws mla::Error.
    void (*check)(const OpSpec& op, const AttrValues& attrs) = nullptr;
    // The int4 zero-point inputs under these attributes, which runtimes scan once when they are
    // constants (nullptr: the op has none).
    ZeroPointInputs (*zero_points)(const OpSpec& op, const AttrValues& attrs) = nullptr;
};

const OpRun& op_run(const OpSpec& op);

// check_attrs, then the op's own cross-attribute rules: what the adapters call when a node is made.
void check_node_attrs(const OpSpec& op, const AttrValues& attrs);

}  // namespace mla::ops
