// The run functions, one per op of the table, in its order (op_run() checks the count and names).
#include "op_runs.hpp"

#include <cstring>
#include <string>

#include "../kernels/moe_experts.hpp"
#include "../kernels/numeric.hpp"
#include "../kernels/qlinear.hpp"
#include "../kernels/qmatmul.hpp"

namespace mla::ops {
namespace {

KvDtype kv_dtype(const OpCall& c) { return kv_dtype_from_name(c.op.name, c.s("kv_dtype")); }

void run_cache_write(OpCall& c) {
    const auto& in = c.inputs;
    int64_t written = 0;
    c.workspace->use([&](Workspace& ws) { written = cache_write(in[0], in[1], in[2], in[3], c.threading, kv_dtype(c), ws); });
    c.output(0, {1}).ptr<int32_t>()[0] = static_cast<int32_t>(written);
}

void run_attention(OpCall& c) {
    const auto& in = c.inputs;
    AttentionPlan plan = plan_attention(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], c.f("scale"),
                                        static_cast<Form>(c.i("form")), kv_dtype(c), c.given(9) ? &in[9] : nullptr);
    plan.bf16_products = c.s("compute") == "bf16";
    const TensorView out = c.output(0, {plan.shapes.tokens, plan.shapes.heads, plan.shapes.v_dim});
    c.workspace->use([&](Workspace& ws) { mla::run_attention(plan, out, c.threading, ws); });
}

void run_indexer_topk(OpCall& c) {
    const auto& in = c.inputs;
    IndexerPlan plan = plan_indexer(in[0], in[1], in[2], in[3], in[4], in[5], c.i("topk"), kv_dtype(c));
    plan.bf16_products = c.s("compute") == "bf16";
    const TensorView out = c.output(0, {plan.tokens, plan.topk});
    c.workspace->use([&](Workspace& ws) { run_indexer(plan, out, c.threading, ws); });
}

// The metadata and the caches checked, then input_ids, positions and slot_mapping passed through.
void run_step_check(OpCall& c) {
    const auto& in = c.inputs;
    const std::vector<TensorView> caches(in.begin() + 7, in.end());
    step_check(StepInputs{in[0], in[1], in[2], in[3], in[4], in[5], in[6]}, caches, c.i("vocab_size"),
               c.i("max_positions"));
    for (size_t k = 0; k < 3; ++k) {
        const TensorView out = c.output(k, in[k].shape);
        if (out.dtype != in[k].dtype)
            throw Error(std::string(c.op.name) + ": input '" + in[k].name + "' must be " + dtype_name(out.dtype));
        std::memcpy(out.data, in[k].data, static_cast<size_t>(in[k].numel() * dtype_size(in[k].dtype)));
    }
}

MoeBits moe_bits(const OpSpec& op, const AttrValues& a) { return {attr_i(op, a, "w13_bits"), attr_i(op, a, "w2_bits")}; }

void run_moe_experts(OpCall& c) {
    const auto& in = c.inputs;
    const MoeInputs moe{in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], c.zero_points_checked,
                        layout_is_tile16(c.op.name, c.s("layout"))};
    const MoeBits bits = moe_bits(c.op, c.attrs);
    const MoeShapes s = moe_experts_shapes(moe, bits);
    const TensorView out = c.output(0, {s.tokens, s.hidden});
    moe_experts(moe, bits, out, c.threading, compute_from_name(c.op.name, c.s("compute")));
}

void run_qlinear(OpCall& c) {
    const auto& in = c.inputs;
    const QLinearInputs q{in[0], in[1], in[2], in[3], c.zero_points_checked, layout_is_tile16(c.op.name, c.s("layout"))};
    const TensorView out = c.output(0, qlinear_shape(q, c.i("bits")));
    qlinear(q, c.i("bits"), out, c.threading, compute_from_name(c.op.name, c.s("compute")));
}

// tile16 holds the formats whose entry says so (weight_format.hpp).
void check_qlinear(const OpSpec& op, const AttrValues& a) {
    check_qlinear_layout(op.name, attr_s(op, a, "layout") == "tile16", attr_i(op, a, "bits"));
}
void check_moe(const OpSpec& op, const AttrValues& a) {
    const bool tile16 = attr_s(op, a, "layout") == "tile16";
    const MoeBits bits = moe_bits(op, a);
    check_qlinear_layout(op.name, tile16, bits.w13, "w13_bits");
    check_qlinear_layout(op.name, tile16, bits.w2, "w2_bits");
}

ZeroPointInputs moe_zero_points(const OpSpec& op, const AttrValues& a) { return int4_zero_point_inputs(moe_bits(op, a)); }
ZeroPointInputs qlinear_zero_points(const OpSpec& op, const AttrValues& a) {
    return int4_zero_point_inputs(attr_i(op, a, "bits"));
}

// In the table's order (OpId).
const OpRun kRuns[] = {
    {run_cache_write},
    {run_attention},
    {run_indexer_topk},
    {run_step_check},
    {run_moe_experts, check_moe, moe_zero_points},
    {run_qlinear, check_qlinear, qlinear_zero_points},
};
static_assert(sizeof(kRuns) / sizeof(kRuns[0]) == kNumOps, "one run function per op of mla_export/ops/table.json");
static_assert(static_cast<int>(OpId::MlaCacheWrite) == 0 && static_cast<int>(OpId::MlaPagedAttention) == 1 &&
                  static_cast<int>(OpId::MlaIndexerTopK) == 2 && static_cast<int>(OpId::MlaStepCheck) == 3 &&
                  static_cast<int>(OpId::MlaMoeExperts) == 4 && static_cast<int>(OpId::MlaQLinear) == 5,
              "kRuns follows the table's order");

}  // namespace

const OpRun& op_run(const OpSpec& op) { return kRuns[&op - kOps]; }

void check_node_attrs(const OpSpec& op, const AttrValues& attrs) {
    check_attrs(op, attrs);
    if (const auto check = op_run(op).check) check(op, attrs);
}

}  // namespace mla::ops
