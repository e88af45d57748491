#include "mla_ops.hpp"

#include <openvino/core/parallel.hpp>
#include <openvino/op/constant.hpp>
#include <openvino/op/convert.hpp>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../kernels/mla_kernels.hpp"
#include "../kernels/qmatmul.hpp"
#include "../op_table/op_runs.hpp"

namespace mla_ov {
namespace {

mla::DType dtype_of(const ov::element::Type& t) {
    switch (t) {
        case ov::element::f32: return mla::DType::f32;
        case ov::element::bf16: return mla::DType::bf16;
        case ov::element::f16: return mla::DType::f16;
        case ov::element::i32: return mla::DType::i32;
        case ov::element::i64: return mla::DType::i64;
        case ov::element::u8: return mla::DType::u8;
        default: return mla::DType::other;
    }
}

mla::TensorView view(const ov::Tensor& t, const char* name) {
    mla::TensorView v;
    v.name = name;
    v.data = const_cast<void*>(t.data());  // cache writes go through this pointer
    v.dtype = dtype_of(t.get_element_type());
    for (auto d : t.get_shape()) v.shape.push_back(static_cast<int64_t>(d));
    return v;
}

// The zero-point inputs' Constants, or nothing when one is not a u8 Constant (then the kernels
// scan per call, and a wrong dtype is named by them).
ZeroPointScan::Constants constants_of(const ov::Node& node, const std::vector<std::pair<size_t, const char*>>& inputs) {
    ZeroPointScan::Constants out;
    for (const auto& [index, name] : inputs) {
        const auto c = ov::as_type_ptr<ov::op::v0::Constant>(node.get_input_node_shared_ptr(index));
        if (!c || c->get_element_type() != ov::element::u8) return {};
        out.push_back(c);
    }
    return out;
}

ZeroPointScan::Bytes bytes_of(const ZeroPointScan::Constants& constants) {
    ZeroPointScan::Bytes out;
    for (const auto& c : constants) out.emplace_back(c->get_data_ptr(), c->get_byte_size());
    return out;
}

}  // namespace

void ZeroPointScan::update(const ov::Node& node, const std::vector<std::pair<size_t, const char*>>& inputs) {
    Bytes from_source;
    from_source.swap(inherited);  // one use only
    Constants now = constants_of(node, inputs);
    const Bytes now_bytes = bytes_of(now);
    // Bytes scanned before: by this node, which still holds their Constants (so no other tensor
    // can sit at those addresses), or by the node it was cloned from, alive while it cloned.
    const bool known = !now.empty() && ((checked && now_bytes == bytes_of(scanned)) || now_bytes == from_source);
    // A node nothing consumes yet is being made: by a reader (validated again once wired) or by
    // the plugin's shape inference (never run): a scan there would be wasted work.
    const bool unwired = node.get_output_size() > 0 && node.get_output_target_inputs(0).empty();
    if (inputs.empty() || known) {
        checked = true;
    } else if (now.empty() || unwired) {
        checked = false;
    } else {
        for (size_t i = 0; i < inputs.size(); ++i) {
            mla::TensorView v;
            v.name = inputs[i].second;
            v.data = const_cast<void*>(now[i]->get_data_ptr());
            v.dtype = mla::DType::u8;
            for (auto d : now[i]->get_shape()) v.shape.push_back(static_cast<int64_t>(d));
            mla::check_int4_zero_points(node.get_type_name(), v);
        }
        checked = true;
    }
    scanned = checked ? std::move(now) : Constants{};
}

ZeroPointScan::Bytes ZeroPointScan::for_clone(const ov::Node& node,
                                              const std::vector<std::pair<size_t, const char*>>& inputs) const {
    if (!checked || scanned.empty()) return {};
    Bytes held = bytes_of(scanned);
    return bytes_of(constants_of(node, inputs)) == held ? held : Bytes{};
}

namespace {

// OpenVINO's CPU plugin loses an exception thrown by a node when it runs the graph on one thread
// (INFERENCE_NUM_THREADS=1: infer() returns as if the step had run, with stale or zero outputs;
// measured on 2026.4.1). So every op also records its failure here, and the Python executors
// check the count around infer() (mla_export_ov_error_count / mla_export_ov_last_error below).
std::atomic<uint64_t> g_error_count{0};
std::mutex g_error_mutex;
std::string g_last_error;

template <typename Fn>
bool recorded(Fn&& fn) {
    try {
        fn();
        return true;
    } catch (const std::exception& e) {
        {
            std::lock_guard<std::mutex> lock(g_error_mutex);
            g_last_error = e.what();
        }
        g_error_count.fetch_add(1);
        throw;
    }
}

mla::Threading ov_threading() {
    mla::Threading th;
    th.parallel_for = [](int64_t n, const std::function<void(int64_t)>& body) {
        if (n == 1) {
            body(0);
            return;
        }
        ov::parallel_for(static_cast<size_t>(n), [&](size_t i) { body(static_cast<int64_t>(i)); });
    };
    th.num_threads = std::max(1, parallel_get_max_threads());
    return th;
}

// OpenVINO's CPU plugin runs i64 as i32: when it compiles a model it puts a Convert(i64 -> i32)
// between an i64 model input and its consumers, which wraps a value beyond int32 (2**32 + k
// becomes k) before any op sees it, so an invalid index would run as a valid one. The index
// inputs the table marks exact_i64 read past such a narrowing Convert instead: the kernels take i64 indices and
// range-check them (as onnxruntime hands them over), so a value that does not fit is refused,
// naming the input. For any index that fits, the values are the same either way.
void read_i64_indices(ov::Node* node, const std::vector<size_t>& inputs) {
    for (const size_t i : inputs) {
        if (i >= node->get_input_size()) continue;  // an optional input that is not there
        const auto convert = ov::as_type_ptr<ov::op::v0::Convert>(node->get_input_node_shared_ptr(i));
        if (convert && convert->get_input_element_type(0) == ov::element::i64 &&
            convert->get_output_element_type(0) == ov::element::i32)
            node->input(i).replace_source_output(convert->input_value(0));
    }
}

}  // namespace

// ---------------------------------------------------------------- any op of the table

namespace {

ov::element::Type element_type(mla::ops::TypeClass t) {
    switch (t) {
        case mla::ops::TypeClass::i32: return ov::element::i32;
        case mla::ops::TypeClass::f32: return ov::element::f32;
        default: return ov::element::dynamic;  // a class of several types: the table says "=input" instead
    }
}

// An output's partial shape by the table's rule: a dimension of an input whose rank is not the
// table's (or not known yet) is dynamic; "input[:-1]" of an input of unknown rank makes it all dynamic.
ov::PartialShape output_shape(const ov::Node& node, const mla::ops::OpSpec& op, const mla::ops::AttrValues& attrs,
                              const mla::ops::OutputSpec& out) {
    using mla::ops::DimKind;
    std::vector<ov::Dimension> dims;
    for (int t = 0; t < out.n_terms; ++t) {
        const mla::ops::DimTerm& term = out.shape[t];
        if (term.kind == DimKind::constant) {
            dims.emplace_back(term.value);
        } else if (term.kind == DimKind::attribute) {
            dims.emplace_back(attrs[static_cast<size_t>(term.ref)].i);
        } else {
            const auto& ps = node.get_input_partial_shape(static_cast<size_t>(term.ref));
            const int64_t rank = ps.rank().is_static() ? ps.rank().get_length() : -1;
            const int want = op.inputs[term.ref].rank;
            if (term.kind == DimKind::leading) {
                if (rank < 1) return ov::PartialShape::dynamic();
                for (int64_t d = 0; d + 1 < rank; ++d) dims.push_back(ps[d]);
            } else {
                const bool known = rank >= 0 && (want < 0 ? rank > term.axis : rank == want);
                dims.push_back(known ? ps[term.axis] : ov::Dimension::dynamic());
            }
        }
    }
    return ov::PartialShape(dims);
}

}  // namespace

void validate_node(ov::Node& node, const mla::ops::OpSpec& op, const mla::ops::AttrValues& attrs, ZeroPointScan& zp) {
    const size_t n = node.get_input_size(), required = op.required_inputs(), optional = op.optional_inputs();
    if (op.variadic()) {
        NODE_VALIDATION_CHECK(&node, n >= required + 1, op.name, " takes the ", required, " inputs and at least one ",
                              op.inputs[op.n_inputs - 1].name, ", got ", n, " inputs");
    } else {
        NODE_VALIDATION_CHECK(&node, n >= required && n <= required + optional, op.name, " takes ", required,
                              " inputs", optional ? " (and " + std::to_string(optional) + " optional ones)" : "",
                              ", got ", n);
    }
    std::vector<size_t> exact;
    for (int i = 0; i < op.n_inputs; ++i)
        if (op.inputs[i].exact_i64) exact.push_back(static_cast<size_t>(i));
    read_i64_indices(&node, exact);
    try {
        mla::ops::check_node_attrs(op, attrs);
        if (const auto zero_points = mla::ops::op_run(op).zero_points) zp.update(node, zero_points(op, attrs));
    } catch (const mla::Error& e) {
        NODE_VALIDATION_CHECK(&node, false, e.what());
    }
    for (int k = 0; k < op.n_outputs; ++k) {
        const mla::ops::OutputSpec& out = op.outputs[k];
        const auto type = out.like_input >= 0 ? node.get_input_element_type(static_cast<size_t>(out.like_input))
                                              : element_type(out.type);
        node.set_output_type(static_cast<size_t>(k), type, output_shape(node, op, attrs, out));
    }
}

ZeroPointScan::Bytes bytes_for_clone(const ov::Node& node, const mla::ops::OpSpec& op, const mla::ops::AttrValues& attrs,
                                     const ZeroPointScan& zp) {
    const auto zero_points = mla::ops::op_run(op).zero_points;
    return zero_points ? zp.for_clone(node, zero_points(op, attrs)) : ZeroPointScan::Bytes{};
}

void visit(ov::AttributeVisitor& visitor, const mla::ops::OpSpec& op, mla::ops::AttrValues& attrs) {
    for (int k = 0; k < op.n_attrs; ++k) {
        auto& v = attrs[static_cast<size_t>(k)];
        switch (op.attrs[k].type) {
            case mla::ops::AttrType::f32: visitor.on_attribute(op.attrs[k].name, v.f); break;
            case mla::ops::AttrType::i64: visitor.on_attribute(op.attrs[k].name, v.i); break;
            case mla::ops::AttrType::str: visitor.on_attribute(op.attrs[k].name, v.s); break;
        }
    }
}

bool evaluate_node(const mla::ops::OpSpec& op, const mla::ops::AttrValues& attrs, bool zero_points_checked,
                   mla::OpWorkspace& ws, ov::TensorVector& outputs, const ov::TensorVector& inputs) {
    return recorded([&] {
        mla::ops::OpCall call{op, attrs, {}, nullptr, ov_threading(), &ws, zero_points_checked};
        for (size_t i = 0; i < inputs.size(); ++i) call.inputs.push_back(view(inputs[i], mla::ops::input_name(op, i)));
        call.output = [&](size_t k, const std::vector<int64_t>& shape) {
            outputs[k].set_shape(ov::Shape(shape.begin(), shape.end()));
            return view(outputs[k], "output");
        };
        mla::ops::op_run(op).run(call);
    });
}

}  // namespace mla_ov

extern "C" {
// How many op calls have failed in this process so far, and the last failure's message (copied
// into buf, NUL-terminated; returns its full length).
__attribute__((visibility("default"))) uint64_t mla_export_ov_error_count() { return mla_ov::g_error_count.load(); }
__attribute__((visibility("default"))) size_t mla_export_ov_last_error(char* buf, size_t size) {
    std::lock_guard<std::mutex> lock(mla_ov::g_error_mutex);
    if (size) {
        const size_t n = std::min(size - 1, mla_ov::g_last_error.size());
        std::memcpy(buf, mla_ov::g_last_error.data(), n);
        buf[n] = 0;
    }
    return mla_ov::g_last_error.size();
}
}

// The step check callable without a graph: the OpenVINO executor runs it before infer() when the
// plugin runs on one thread, where a node's exception is not only lost but leaves the process in
// a state in which a later single-thread infer() crashed (measured on 2026.4.1). Metadata arrays
// are i32; the caches are described by their shape (all alike, as the executor binds them).
// Returns 0 when the step is valid, else 1 with the message in err.
extern "C" __attribute__((visibility("default"))) int mla_export_step_check(
    const int32_t* const* arrays, const int64_t* lengths, int64_t block_width, int64_t num_blocks,
    int64_t block_size, int64_t row_width, int64_t num_layers, int64_t vocab_size, int64_t max_positions,
    char* err, size_t err_size) {
    const mla::ops::OpSpec& op = mla::ops::spec(mla::ops::OpId::MlaStepCheck);
    try {
        mla::TensorView v[7];
        for (int i = 0; i < 7; ++i) {
            v[i].name = mla::ops::input_name(op, static_cast<size_t>(i));
            v[i].data = const_cast<int32_t*>(arrays[i]);
            v[i].dtype = mla::DType::i32;
            v[i].shape = {lengths[i]};
        }
        v[5].shape = {lengths[5], block_width};
        static float dummy = 0.f;  // never read: the check looks at the caches' shapes only
        std::vector<mla::TensorView> caches(static_cast<size_t>(num_layers));
        for (int64_t i = 0; i < num_layers; ++i) {
            caches[i].name = mla::ops::input_name(op, static_cast<size_t>(7 + i));
            caches[i].data = &dummy;
            caches[i].dtype = mla::DType::f32;
            caches[i].shape = {num_blocks, block_size, row_width};
        }
        mla::step_check(mla::StepInputs{v[0], v[1], v[2], v[3], v[4], v[5], v[6]}, caches, vocab_size, max_positions);
        return 0;
    } catch (const std::exception& e) {
        if (err_size) {
            const size_t n = std::min(err_size - 1, std::strlen(e.what()));
            std::memcpy(err, e.what(), n);
            err[n] = 0;
        }
        return 1;
    }
}
