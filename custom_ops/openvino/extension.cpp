// The extension's entry point: the op classes (to read IR back) and the ONNX frontend
// conversions of the `mla_export` domain, one of each per op of the table (custom_ops/op_table).
// The conversions read every attribute the table lists, explicitly: with the declarative
// OpExtension and no attribute map, an ONNX attribute was seen to keep the op's default silently.
#include <utility>

#include <openvino/core/extension.hpp>
#include <openvino/core/op_extension.hpp>
#include <openvino/frontend/onnx/extension/conversion.hpp>

#include "../kernels/mla_kernels.hpp"
#include "mla_ops.hpp"

namespace {

ov::OutputVector inputs_of(const ov::frontend::NodeContext& ctx) {
    ov::OutputVector args;
    for (size_t i = 0; i < ctx.get_input_size(); ++i) args.push_back(ctx.get_input(static_cast<int>(i)));
    return args;
}

// The node's attributes by the table: a required one the node lacks fails the conversion (the
// frontend names it); an optional one takes the table's default.
mla::ops::AttrValues attributes_of(const mla::ops::OpSpec& op, const ov::frontend::NodeContext& ctx) {
    mla::ops::AttrValues v = mla::ops::default_attrs(op);
    for (int k = 0; k < op.n_attrs; ++k) {
        const mla::ops::AttrSpec& a = op.attrs[k];
        auto& x = v[static_cast<size_t>(k)];
        switch (a.type) {
            case mla::ops::AttrType::f32:
                x.f = a.has_default ? ctx.get_attribute<float>(a.name, a.default_f) : ctx.get_attribute<float>(a.name);
                break;
            case mla::ops::AttrType::i64:
                x.i = a.has_default ? ctx.get_attribute<int64_t>(a.name, a.default_i) : ctx.get_attribute<int64_t>(a.name);
                break;
            case mla::ops::AttrType::str:
                x.s = a.has_default ? ctx.get_attribute<std::string>(a.name, a.default_s)
                                    : ctx.get_attribute<std::string>(a.name);
                break;
        }
    }
    return v;
}

template <int I>
ov::OutputVector convert(const ov::frontend::NodeContext& ctx) {
    using Op = mla_ov::TableOp<I>;
    return std::make_shared<Op>(inputs_of(ctx), attributes_of(Op::op(), ctx))->outputs();
}

template <int... I>
std::vector<ov::Extension::Ptr> extensions(std::integer_sequence<int, I...>) {
    return {std::make_shared<ov::OpExtension<mla_ov::TableOp<I>>>()...,
            std::make_shared<ov::frontend::onnx::ConversionExtension>(mla::ops::kOps[I].name, mla::ops::kDomain,
                                                                      convert<I>)...};
}

}  // namespace

// The kernel switchboard for Python (mla_export/ops/kernel_config.py; kernel_config.hpp): spec (null or
// empty: no change) replaces the configuration, then out gets the one in use; 1 = done, 0 = out
// holds the error.
extern "C" __attribute__((visibility("default"))) int MlaExportKernels(const char* spec, char* out, size_t out_len) {
    return mla::kernels_call(spec, out, out_len);
}
// The CPU features the kernels probed, in /proc/cpuinfo's names (cpu_features.hpp).
extern "C" __attribute__((visibility("default"))) const char* MlaExportCpuFeatures() { return mla::cpu_feature_names(); }
// The op table this library was built from, as JSON (mla_export.ops checks it against table.json).
extern "C" __attribute__((visibility("default"))) const char* mla_export_op_table() {
    return mla::ops::table_json().c_str();
}

OPENVINO_CREATE_EXTENSIONS(extensions(std::make_integer_sequence<int, mla::ops::kNumOps>{}));
