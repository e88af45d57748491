// The extension's entry point: the op classes (to read IR back) and the ONNX frontend
// conversions of the `mla_export` domain. The conversions read attributes explicitly: with the
// declarative OpExtension and no attribute map, an ONNX attribute was seen to keep the op's
// default silently.
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

// The cache's row format; absent = "" (by the cache's element type, u8 = bf16 rows).
std::string kv_dtype_of(const ov::frontend::NodeContext& ctx) {
    return ctx.get_attribute<std::string>("kv_dtype", "");
}

ov::OutputVector convert_cache_write(const ov::frontend::NodeContext& ctx) {
    return std::make_shared<mla_ov::MlaCacheWrite>(inputs_of(ctx), kv_dtype_of(ctx))->outputs();
}

ov::OutputVector convert_decode(const ov::frontend::NodeContext& ctx) {
    const float scale = ctx.get_attribute<float>("scale");
    const int64_t rank = ctx.get_attribute<int64_t>("kv_lora_rank");  // required: no model's r is a default
    return std::make_shared<mla_ov::MlaPagedDecode>(inputs_of(ctx), scale, rank, kv_dtype_of(ctx))->outputs();
}

ov::OutputVector convert_attention(const ov::frontend::NodeContext& ctx) {
    const float scale = ctx.get_attribute<float>("scale");
    const int64_t form = ctx.get_attribute<int64_t>("form", 0);
    const std::string compute = ctx.get_attribute<std::string>("compute", "f32");
    return std::make_shared<mla_ov::MlaPagedAttention>(inputs_of(ctx), scale, form, kv_dtype_of(ctx), compute)->outputs();
}

ov::OutputVector convert_indexer(const ov::frontend::NodeContext& ctx) {
    const int64_t topk = ctx.get_attribute<int64_t>("topk");  // required: the model's index_topk
    const std::string compute = ctx.get_attribute<std::string>("compute", "f32");
    return std::make_shared<mla_ov::MlaIndexerTopK>(inputs_of(ctx), topk, kv_dtype_of(ctx), compute)->outputs();
}

ov::OutputVector convert_step_check(const ov::frontend::NodeContext& ctx) {
    const int64_t vocab = ctx.get_attribute<int64_t>("vocab_size");
    const int64_t max_pos = ctx.get_attribute<int64_t>("max_positions");
    return std::make_shared<mla_ov::MlaStepCheck>(inputs_of(ctx), vocab, max_pos)->outputs();
}

ov::OutputVector convert_moe_experts(const ov::frontend::NodeContext& ctx) {
    const int64_t w13_bits = ctx.get_attribute<int64_t>("w13_bits");
    const int64_t w2_bits = ctx.get_attribute<int64_t>("w2_bits");
    const std::string compute = ctx.get_attribute<std::string>("compute", "f32");
    return std::make_shared<mla_ov::MlaMoeExperts>(inputs_of(ctx), w13_bits, w2_bits, compute)->outputs();
}

ov::OutputVector convert_qlinear(const ov::frontend::NodeContext& ctx) {
    const int64_t bits = ctx.get_attribute<int64_t>("bits");
    const std::string compute = ctx.get_attribute<std::string>("compute", "f32");
    const std::string layout = ctx.get_attribute<std::string>("layout", "rows4");
    return std::make_shared<mla_ov::MlaQLinear>(inputs_of(ctx), bits, compute, mla_ov::ZeroPointScan::Bytes{}, layout)
        ->outputs();
}

}  // namespace

// The kernel switchboard for Python (mla_export/kernel_config.py; kernel_config.hpp): spec (null or
// empty: no change) replaces the configuration, then out gets the one in use; 1 = done, 0 = out
// holds the error.
extern "C" __attribute__((visibility("default"))) int MlaExportKernels(const char* spec, char* out, size_t out_len) {
    return mla::kernels_call(spec, out, out_len);
}
// The CPU features the kernels probed, in /proc/cpuinfo's names (cpu_features.hpp).
extern "C" __attribute__((visibility("default"))) const char* MlaExportCpuFeatures() { return mla::cpu_feature_names(); }

OPENVINO_CREATE_EXTENSIONS(std::vector<ov::Extension::Ptr>({
    std::make_shared<ov::OpExtension<mla_ov::MlaCacheWrite>>(),
    std::make_shared<ov::OpExtension<mla_ov::MlaPagedDecode>>(),
    std::make_shared<ov::OpExtension<mla_ov::MlaPagedAttention>>(),
    std::make_shared<ov::OpExtension<mla_ov::MlaIndexerTopK>>(),
    std::make_shared<ov::OpExtension<mla_ov::MlaStepCheck>>(),
    std::make_shared<ov::OpExtension<mla_ov::MlaMoeExperts>>(),
    std::make_shared<ov::OpExtension<mla_ov::MlaQLinear>>(),
    std::make_shared<ov::frontend::onnx::ConversionExtension>("MlaCacheWrite", "mla_export", convert_cache_write),
    std::make_shared<ov::frontend::onnx::ConversionExtension>("MlaPagedDecode", "mla_export", convert_decode),
    std::make_shared<ov::frontend::onnx::ConversionExtension>("MlaPagedAttention", "mla_export", convert_attention),
    std::make_shared<ov::frontend::onnx::ConversionExtension>("MlaIndexerTopK", "mla_export", convert_indexer),
    std::make_shared<ov::frontend::onnx::ConversionExtension>("MlaStepCheck", "mla_export", convert_step_check),
    std::make_shared<ov::frontend::onnx::ConversionExtension>("MlaMoeExperts", "mla_export", convert_moe_experts),
    std::make_shared<ov::frontend::onnx::ConversionExtension>("MlaQLinear", "mla_export", convert_qlinear),
}));
