// The OpenVINO side of the mla_export ops (opset "mla_export"): one generic op class, TableOp<I>,
// for every op of the table (custom_ops/op_table: its name, inputs, attributes and output rule),
// which only translates tensors and attributes; validation and math live in the kernels (each
// op's run function: op_runs.cpp). Each runs on the CPU plugin as a reference node whose
// evaluate() is called with the real input buffers, which is what lets MlaCacheWrite update a
// shared-memory cache Parameter in place.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <openvino/op/constant.hpp>
#include <openvino/op/op.hpp>

#include "../kernels/mla_kernels.hpp"
#include "../op_table/op_table.hpp"

namespace mla_ov {

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

// What TableOp<I> does, for any op of the table (mla_ops.cpp).
void validate_node(ov::Node& node, const mla::ops::OpSpec& op, const mla::ops::AttrValues& attrs, ZeroPointScan& zp);
ZeroPointScan::Bytes bytes_for_clone(const ov::Node& node, const mla::ops::OpSpec& op,
                                     const mla::ops::AttrValues& attrs, const ZeroPointScan& zp);
void visit(ov::AttributeVisitor& visitor, const mla::ops::OpSpec& op, mla::ops::AttrValues& attrs);
bool evaluate_node(const mla::ops::OpSpec& op, const mla::ops::AttrValues& attrs, bool zero_points_checked,
                   mla::OpWorkspace& ws, ov::TensorVector& outputs, const ov::TensorVector& inputs);

// The op kOps[I] of the table. The default constructor (used when IR is read) starts from the
// table's defaults; a required attribute the IR lacks is refused when the node is validated.
template <int I>
class TableOp : public ov::op::Op {
public:
    OPENVINO_OP(mla::ops::kOps[I].name, "mla_export");
    static const mla::ops::OpSpec& op() { return mla::ops::kOps[I]; }

    TableOp() : m_attrs(mla::ops::default_attrs(op())) {}
    // inherited: the zero-point bytes a clone's source scanned (ZeroPointScan).
    TableOp(const ov::OutputVector& args, mla::ops::AttrValues attrs, ZeroPointScan::Bytes inherited = {})
        : Op(args), m_attrs(std::move(attrs)) {
        m_zp.inherited = std::move(inherited);
        constructor_validate_and_infer_types();
    }
    void validate_and_infer_types() override { validate_node(*this, op(), m_attrs, m_zp); }
    std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& args) const override {
        return std::make_shared<TableOp>(args, m_attrs, bytes_for_clone(*this, op(), m_attrs, m_zp));
    }
    bool visit_attributes(ov::AttributeVisitor& visitor) override {
        visit(visitor, op(), m_attrs);
        return true;
    }
    bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override {
        return evaluate_node(op(), m_attrs, m_zp.checked, m_ws, outputs, inputs);
    }
    bool has_evaluate() const override { return true; }

private:
    mla::ops::AttrValues m_attrs;  // in the table's order
    ZeroPointScan m_zp;
    mutable mla::OpWorkspace m_ws;  // reused across evaluate calls
};

}  // namespace mla_ov
