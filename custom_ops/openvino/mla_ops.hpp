// OpenVINO op classes of the MLA ops and the fused MoE op (opset "mla_export"). They only translate tensors
// and attributes; validation and math live in custom_ops/kernels. Each runs on the CPU plugin
// as a reference node whose evaluate() is called with the real input buffers, which is what
// lets MlaCacheWrite update a shared-memory cache Parameter in place.
#pragma once

#include <string>

#include <openvino/op/op.hpp>

#include "../kernels/mla_kernels.hpp"

namespace mla_ov {

// The overrides every op class here has (shape inference, cloning, attributes, evaluate on the
// real buffers); each class defines them in mla_ops.cpp.
#define MLA_OV_OP_OVERRIDES                                                                          \
    void validate_and_infer_types() override;                                                         \
    std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& args) const override;     \
    bool visit_attributes(ov::AttributeVisitor& visitor) override;                                    \
    bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override;          \
    bool has_evaluate() const override { return true; }

class MlaCacheWrite : public ov::op::Op {
public:
    OPENVINO_OP("MlaCacheWrite", "mla_export");
    MlaCacheWrite() = default;
    // kv_c, k_pe, kv_cache, slot_mapping
    explicit MlaCacheWrite(const ov::OutputVector& args, std::string kv_dtype = "");
    MLA_OV_OP_OVERRIDES

private:
    std::string m_kv_dtype;  // the cache's row format ("" = by element type, see cache_format.hpp)
    mutable mla::OpWorkspace m_ws;  // reused across evaluate calls
};

class MlaPagedDecode : public ov::op::Op {
public:
    OPENVINO_OP("MlaPagedDecode", "mla_export");
    MlaPagedDecode() = default;
    // q, kv_cache, block_tables, seq_lens [, after]
    MlaPagedDecode(const ov::OutputVector& args, float scale, int64_t kv_lora_rank, std::string kv_dtype = "");
    MLA_OV_OP_OVERRIDES

private:
    float m_scale = 1.0f;
    int64_t m_kv_lora_rank = 0;  // set by the constructor or the IR's attribute (checked > 0)
    std::string m_kv_dtype;
    mutable mla::OpWorkspace m_ws;  // reused across evaluate calls
};

class MlaPagedAttention : public ov::op::Op {
public:
    OPENVINO_OP("MlaPagedAttention", "mla_export");
    MlaPagedAttention() = default;
    // q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens, block_tables [, after]
    MlaPagedAttention(const ov::OutputVector& args, float scale, int64_t form, std::string kv_dtype = "");
    MLA_OV_OP_OVERRIDES

private:
    float m_scale = 1.0f;
    int64_t m_form = 0;
    std::string m_kv_dtype;
    mutable mla::OpWorkspace m_ws;  // reused across evaluate calls
};

// input_ids, positions, slot_mapping, query_start_loc, seq_lens, block_tables, logits_indices,
// kv_cache.0 .. kv_cache.<L-1> -> input_ids, positions, slot_mapping (copies, once the whole step
// passed). The graph reads those three only through this op, so nothing runs before it.
class MlaStepCheck : public ov::op::Op {
public:
    OPENVINO_OP("MlaStepCheck", "mla_export");
    MlaStepCheck() = default;
    MlaStepCheck(const ov::OutputVector& args, int64_t vocab_size, int64_t max_positions);
    MLA_OV_OP_OVERRIDES

private:
    int64_t m_vocab_size = 0;
    int64_t m_max_positions = 0;
};

// x, topk_ids, topk_weights, w13_q, w13_s, w13_zp, w2_q, w2_s, w2_zp -> the routed experts' sum
// (custom_ops/kernels/moe_experts.hpp). The weights are Constants read in place.
class MlaMoeExperts : public ov::op::Op {
public:
    OPENVINO_OP("MlaMoeExperts", "mla_export");
    MlaMoeExperts() = default;
    // compute: "f32" (as exported) or "bf16" (set by the runtime when it compiles for bf16; see
    // moe_experts.hpp, MoeCompute).
    MlaMoeExperts(const ov::OutputVector& args, int64_t w13_bits, int64_t w2_bits, std::string compute = "f32");
    MLA_OV_OP_OVERRIDES

private:
    int64_t m_w13_bits = 8, m_w2_bits = 8;
    std::string m_compute = "f32";
    bool m_zp_checked = false;  // int4 zero points are Constants scanned when the node was made
};

// x, w_q, w_s, w_zp -> x @ W^T on integer weights (custom_ops/kernels/qlinear.hpp); the weights
// are Constants read in place.
class MlaQLinear : public ov::op::Op {
public:
    OPENVINO_OP("MlaQLinear", "mla_export");
    MlaQLinear() = default;
    // compute: as MlaMoeExperts'.
    MlaQLinear(const ov::OutputVector& args, int64_t bits, std::string compute = "f32");
    MLA_OV_OP_OVERRIDES

private:
    int64_t m_bits = 8;
    std::string m_compute = "f32";
    bool m_zp_checked = false;  // int4 zero points are a Constant scanned when the node was made
};

}  // namespace mla_ov
