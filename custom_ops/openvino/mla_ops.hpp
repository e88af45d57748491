// OpenVINO op classes of the MLA ops and the fused MoE op (opset "mla_export"). They only translate tensors
// and attributes; validation and math live in custom_ops/kernels. Each runs on the CPU plugin
// as a reference node whose evaluate() is called with the real input buffers, which is what
// lets MlaCacheWrite update a shared-memory cache Parameter in place.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <openvino/op/constant.hpp>
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
    // q_nope, q_pe, kv_cache, w_uk, w_uv, query_start_loc, seq_lens, block_tables [, after [, topk_indices]]
    // (topk_indices: sparse attention over the listed positions, mla_kernels.hpp). compute: "f32" (as exported: every product f32) or "bf16" (set by the runtime when it
    // compiles for bf16: decode rows may multiply in bf16 on AMX tiles; see attention_amx.hpp).
    MlaPagedAttention(const ov::OutputVector& args, float scale, int64_t form, std::string kv_dtype = "",
                      std::string compute = "f32");
    MLA_OV_OP_OVERRIDES

private:
    float m_scale = 1.0f;
    int64_t m_form = 0;
    std::string m_kv_dtype;
    std::string m_compute = "f32";
    mutable mla::OpWorkspace m_ws;  // reused across evaluate calls
};

class MlaIndexerTopK : public ov::op::Op {
public:
    OPENVINO_OP("MlaIndexerTopK", "mla_export");
    MlaIndexerTopK() = default;
    // q, weights, index_cache, query_start_loc, seq_lens, block_tables [, after] -> [T, topk] i32
    // compute: "f32" (as exported) or "bf16" (set by the runtime under a bf16 hint: the scores may
    // multiply in bf16 on AMX tiles, indexer_amx.hpp).
    MlaIndexerTopK(const ov::OutputVector& args, int64_t topk, std::string kv_dtype = "", std::string compute = "f32");
    MLA_OV_OP_OVERRIDES

private:
    int64_t m_topk = 0;  // set by the constructor or the IR's attribute (checked >= 1)
    std::string m_kv_dtype;
    std::string m_compute = "f32";
    mutable mla::OpWorkspace m_ws;
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

// Whether a node's int4 zero points were scanned (every code <= 15), so its kernels skip the scan
// per call. They are scanned when the node is validated if they are Constants. The CPU plugin
// validates our nodes again on every inference (the node itself, and clones for shape
// inference: ~3.6 validations per MoE call measured on 2026.4.1); rescanning a V2-Lite MoE
// layer's 4.3 MB of zero points each time cost ~0.7 ms of a ~2 ms layer. So a validation skips
// bytes already scanned: by this node (which holds their Constants, so the bytes cannot have
// changed) or, once, by the node it was cloned from; and a node not wired to anything yet is not
// scanned (a reader validates it again once wired; shape inference never runs it).
struct ZeroPointScan {
    using Bytes = std::vector<std::pair<const void*, size_t>>;  // each zero-point Constant's data and size
    using Constants = std::vector<std::shared_ptr<ov::op::v0::Constant>>;
    bool checked = false;
    Constants scanned;  // the Constants the last scan (or inheritance) covered, held: their bytes stay
    Bytes inherited;    // a clone's: its source's scanned bytes, consumed by the next validation
    // Scans (or inherits) node's inputs listed as (index, name); throws mla::Error for a bad one.
    void update(const ov::Node& node, const std::vector<std::pair<size_t, const char*>>& inputs);
    // What a clone of node may inherit: the scanned bytes if node's zero-point inputs still are them.
    Bytes for_clone(const ov::Node& node, const std::vector<std::pair<size_t, const char*>>& inputs) const;
};

// x, topk_ids, topk_weights, w13_q, w13_s, w13_zp, w2_q, w2_s, w2_zp -> the routed experts' sum
// (custom_ops/kernels/moe_experts.hpp). The weights are Constants read in place.
class MlaMoeExperts : public ov::op::Op {
public:
    OPENVINO_OP("MlaMoeExperts", "mla_export");
    MlaMoeExperts() = default;
    // compute: "f32" (as exported) or "bf16" (set by the runtime when it compiles for bf16; see
    // compute.hpp).
    // inherited: the zero-point bytes a clone's source scanned (ZeroPointScan).
    MlaMoeExperts(const ov::OutputVector& args, int64_t w13_bits, int64_t w2_bits, std::string compute = "f32",
                  ZeroPointScan::Bytes inherited = {});
    MLA_OV_OP_OVERRIDES

private:
    int64_t m_w13_bits = 8, m_w2_bits = 8;
    std::string m_compute = "f32";
    ZeroPointScan m_zp;
};

// x, w_q, w_s, w_zp -> x @ W^T on integer weights (custom_ops/kernels/qlinear.hpp); the weights
// are Constants read in place.
class MlaQLinear : public ov::op::Op {
public:
    OPENVINO_OP("MlaQLinear", "mla_export");
    MlaQLinear() = default;
    // compute: as MlaMoeExperts'. layout: the codes' order, "rows4" (as exported) or "tile16" (int8
    // codes the runtime rewrote for VNNI CPUs; qmatmul.hpp).
    MlaQLinear(const ov::OutputVector& args, int64_t bits, std::string compute = "f32",
               ZeroPointScan::Bytes inherited = {}, std::string layout = "rows4");
    MLA_OV_OP_OVERRIDES

private:
    int64_t m_bits = 8;
    std::string m_compute = "f32";
    std::string m_layout = "rows4";
    ZeroPointScan m_zp;
};

}  // namespace mla_ov
