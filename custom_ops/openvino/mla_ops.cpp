#include "mla_ops.hpp"

#include <openvino/core/parallel.hpp>
#include <openvino/op/constant.hpp>
#include <openvino/op/convert.hpp>

#include <atomic>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

#include "../kernels/mla_kernels.hpp"
#include "../kernels/moe_experts.hpp"
#include "../kernels/qlinear.hpp"
#include "../kernels/qmatmul.hpp"

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

// The kv_dtype attribute, checked when the graph is built (not first at inference).
void check_kv_dtype(const ov::Node* node, const std::string& kv_dtype) {
    try {
        mla::kv_dtype_from_name(node->get_type_name(), kv_dtype);
    } catch (const mla::Error& e) {
        NODE_VALIDATION_CHECK(node, false, e.what());
    }
}

// The compute attribute, by the kernels' one check (the onnxruntime ops use the same).
void check_compute(const ov::Node* node, const std::string& compute) {
    try {
        mla::compute_from_name(node->get_type_name(), compute);
    } catch (const mla::Error& e) {
        NODE_VALIDATION_CHECK(node, false, e.what());
    }
}

// OpenVINO's CPU plugin runs i64 as i32: when it compiles a model it puts a Convert(i64 -> i32)
// between an i64 model input and its consumers, which wraps a value beyond int32 (2**32 + k
// becomes k) before any op sees it, so an invalid index would run as a valid one. The index
// inputs listed here read past such a narrowing Convert instead: the kernels take i64 indices and
// range-check them (as onnxruntime hands them over), so a value that does not fit is refused,
// naming the input. For any index that fits, the values are the same either way.
void read_i64_indices(ov::Node* node, std::initializer_list<size_t> inputs) {
    for (const size_t i : inputs) {
        if (i >= node->get_input_size()) continue;  // an optional input that is not there
        const auto convert = ov::as_type_ptr<ov::op::v0::Convert>(node->get_input_node_shared_ptr(i));
        if (convert && convert->get_input_element_type(0) == ov::element::i64 &&
            convert->get_output_element_type(0) == ov::element::i32)
            node->input(i).replace_source_output(convert->input_value(0));
    }
}

void check_inputs(const ov::Node* node, size_t required, size_t optional = 1) {
    const size_t n = node->get_input_size();
    NODE_VALIDATION_CHECK(node, n >= required && n <= required + optional, node->get_type_name(), " takes ", required,
                          optional == 1 ? " inputs (and an optional ordering input), got "
                                        : " inputs (and the optional ordering and topk_indices inputs), got ",
                          n);
}

}  // namespace

// ---------------------------------------------------------------- MlaCacheWrite

MlaCacheWrite::MlaCacheWrite(const ov::OutputVector& args, std::string kv_dtype)
    : Op(args), m_kv_dtype(std::move(kv_dtype)) {
    constructor_validate_and_infer_types();
}

void MlaCacheWrite::validate_and_infer_types() {
    NODE_VALIDATION_CHECK(this, get_input_size() == 4, "MlaCacheWrite takes 4 inputs, got ", get_input_size());
    read_i64_indices(this, {3});  // slot_mapping
    check_kv_dtype(this, m_kv_dtype);
    set_output_type(0, ov::element::i32, ov::PartialShape{1});
}

std::shared_ptr<ov::Node> MlaCacheWrite::clone_with_new_inputs(const ov::OutputVector& args) const {
    return std::make_shared<MlaCacheWrite>(args, m_kv_dtype);
}

bool MlaCacheWrite::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("kv_dtype", m_kv_dtype);
    return true;
}

bool MlaCacheWrite::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    return recorded([&] {
        int64_t written = 0;
        m_ws.use([&](mla::Workspace& ws) {
            written = mla::cache_write(view(inputs[0], "kv_c"), view(inputs[1], "k_pe"), view(inputs[2], "kv_cache"),
                                       view(inputs[3], "slot_mapping"), ov_threading(),
                                       mla::kv_dtype_from_name("MlaCacheWrite", m_kv_dtype), ws);
        });
        outputs[0].set_shape(ov::Shape{1});
        outputs[0].data<int32_t>()[0] = static_cast<int32_t>(written);
    });
}

// ---------------------------------------------------------------- MlaPagedDecode

MlaPagedDecode::MlaPagedDecode(const ov::OutputVector& args, float scale, int64_t kv_lora_rank, std::string kv_dtype)
    : Op(args), m_scale(scale), m_kv_lora_rank(kv_lora_rank), m_kv_dtype(std::move(kv_dtype)) {
    constructor_validate_and_infer_types();
}

void MlaPagedDecode::validate_and_infer_types() {
    check_inputs(this, 4);
    read_i64_indices(this, {2, 3});  // block_tables, seq_lens
    check_kv_dtype(this, m_kv_dtype);
    NODE_VALIDATION_CHECK(this, m_kv_lora_rank > 0, "MlaPagedDecode attribute 'kv_lora_rank' must be positive, got ",
                          m_kv_lora_rank);
    const auto& q = get_input_partial_shape(0);
    ov::PartialShape out = ov::PartialShape::dynamic(3);
    if (q.rank().is_static() && q.rank().get_length() == 3) out = ov::PartialShape{q[0], q[1], m_kv_lora_rank};
    set_output_type(0, get_input_element_type(0), out);
}

std::shared_ptr<ov::Node> MlaPagedDecode::clone_with_new_inputs(const ov::OutputVector& args) const {
    return std::make_shared<MlaPagedDecode>(args, m_scale, m_kv_lora_rank, m_kv_dtype);
}

bool MlaPagedDecode::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("scale", m_scale);
    visitor.on_attribute("kv_lora_rank", m_kv_lora_rank);
    visitor.on_attribute("kv_dtype", m_kv_dtype);
    return true;
}

bool MlaPagedDecode::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    return recorded([&] {
        const auto q = view(inputs[0], "q"), cache = view(inputs[1], "kv_cache");
        const auto bt = view(inputs[2], "block_tables"), lens = view(inputs[3], "seq_lens");
        const auto kv = mla::kv_dtype_from_name("MlaPagedDecode", m_kv_dtype);
        const mla::DecodePlan plan = mla::plan_decode(q, cache, bt, lens, m_scale, m_kv_lora_rank, kv);
        const mla::DecodeShapes& s = plan.shapes;
        outputs[0].set_shape(ov::Shape{size_t(s.batch), size_t(s.heads), size_t(s.rank)});
        m_ws.use([&](mla::Workspace& ws) { mla::run_decode(plan, view(outputs[0], "output"), ov_threading(), ws); });
    });
}

// ---------------------------------------------------------------- MlaPagedAttention

MlaPagedAttention::MlaPagedAttention(const ov::OutputVector& args, float scale, int64_t form, std::string kv_dtype,
                                     std::string compute)
    : Op(args), m_scale(scale), m_form(form), m_kv_dtype(std::move(kv_dtype)), m_compute(std::move(compute)) {
    constructor_validate_and_infer_types();
}

void MlaPagedAttention::validate_and_infer_types() {
    check_inputs(this, 8, 2);
    read_i64_indices(this, {5, 6, 7, 9});  // query_start_loc, seq_lens, block_tables, topk_indices
    check_kv_dtype(this, m_kv_dtype);
    NODE_VALIDATION_CHECK(this, m_form >= 0 && m_form <= 2, "MlaPagedAttention attribute 'form' must be 0 (auto), ",
                          "1 (absorbed) or 2 (expanded), got ", m_form);
    check_compute(this, m_compute);
    const auto& qn = get_input_partial_shape(0);
    const auto& wuv = get_input_partial_shape(4);
    ov::PartialShape out = ov::PartialShape::dynamic(3);
    if (qn.rank().is_static() && qn.rank().get_length() == 3 && wuv.rank().is_static() && wuv.rank().get_length() == 3)
        out = ov::PartialShape{qn[0], qn[1], wuv[2]};
    set_output_type(0, get_input_element_type(0), out);
}

std::shared_ptr<ov::Node> MlaPagedAttention::clone_with_new_inputs(const ov::OutputVector& args) const {
    return std::make_shared<MlaPagedAttention>(args, m_scale, m_form, m_kv_dtype, m_compute);
}

bool MlaPagedAttention::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("scale", m_scale);
    visitor.on_attribute("form", m_form);
    visitor.on_attribute("kv_dtype", m_kv_dtype);
    visitor.on_attribute("compute", m_compute);
    return true;
}

bool MlaPagedAttention::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    return recorded([&] {
        const auto qn = view(inputs[0], "q_nope"), qp = view(inputs[1], "q_pe"), cache = view(inputs[2], "kv_cache");
        const auto wuk = view(inputs[3], "w_uk"), wuv = view(inputs[4], "w_uv");
        const auto qsl = view(inputs[5], "query_start_loc"), lens = view(inputs[6], "seq_lens");
        const auto bt = view(inputs[7], "block_tables");
        const auto kv = mla::kv_dtype_from_name("MlaPagedAttention", m_kv_dtype);
        mla::TensorView topk;
        if (inputs.size() > 9) topk = view(inputs[9], "topk_indices");
        mla::AttentionPlan plan = mla::plan_attention(qn, qp, cache, wuk, wuv, qsl, lens, bt, m_scale,
                                                      static_cast<mla::Form>(m_form), kv,
                                                      inputs.size() > 9 ? &topk : nullptr);
        plan.bf16_products = m_compute == "bf16";
        const mla::AttentionShapes& s = plan.shapes;
        outputs[0].set_shape(ov::Shape{size_t(s.tokens), size_t(s.heads), size_t(s.v_dim)});
        m_ws.use([&](mla::Workspace& ws) { mla::run_attention(plan, view(outputs[0], "output"), ov_threading(), ws); });
    });
}

// ---------------------------------------------------------------- MlaIndexerTopK

MlaIndexerTopK::MlaIndexerTopK(const ov::OutputVector& args, int64_t topk, std::string kv_dtype, std::string compute)
    : Op(args), m_topk(topk), m_kv_dtype(std::move(kv_dtype)), m_compute(std::move(compute)) {
    constructor_validate_and_infer_types();
}

void MlaIndexerTopK::validate_and_infer_types() {
    check_inputs(this, 6);
    read_i64_indices(this, {3, 4, 5});  // query_start_loc, seq_lens, block_tables
    check_kv_dtype(this, m_kv_dtype);
    NODE_VALIDATION_CHECK(this, m_topk >= 1, "MlaIndexerTopK attribute 'topk' must be >= 1, got ", m_topk);
    check_compute(this, m_compute);
    const auto& q = get_input_partial_shape(0);
    ov::Dimension tokens = ov::Dimension::dynamic();
    if (q.rank().is_static() && q.rank().get_length() == 3) tokens = q[0];
    set_output_type(0, ov::element::i32, ov::PartialShape{tokens, m_topk});
}

std::shared_ptr<ov::Node> MlaIndexerTopK::clone_with_new_inputs(const ov::OutputVector& args) const {
    return std::make_shared<MlaIndexerTopK>(args, m_topk, m_kv_dtype, m_compute);
}

bool MlaIndexerTopK::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("topk", m_topk);
    visitor.on_attribute("kv_dtype", m_kv_dtype);
    visitor.on_attribute("compute", m_compute);
    return true;
}

bool MlaIndexerTopK::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    return recorded([&] {
        const auto q = view(inputs[0], "q"), w = view(inputs[1], "weights"), cache = view(inputs[2], "index_cache");
        const auto qsl = view(inputs[3], "query_start_loc"), lens = view(inputs[4], "seq_lens");
        const auto bt = view(inputs[5], "block_tables");
        const auto kv = mla::kv_dtype_from_name("MlaIndexerTopK", m_kv_dtype);
        mla::IndexerPlan plan = mla::plan_indexer(q, w, cache, qsl, lens, bt, m_topk, kv);
        plan.bf16_products = m_compute == "bf16";
        outputs[0].set_shape(ov::Shape{size_t(plan.tokens), size_t(plan.topk)});
        m_ws.use([&](mla::Workspace& ws) { mla::run_indexer(plan, view(outputs[0], "output"), ov_threading(), ws); });
    });
}

// ---------------------------------------------------------------- MlaStepCheck

namespace {
const char* const kStepNames[] = {"input_ids", "positions", "slot_mapping", "query_start_loc",
                                  "seq_lens", "block_tables", "logits_indices"};
constexpr size_t kStepMeta = 7;

// "kv_cache.<i>" names that outlive the views pointing at them.
const std::vector<std::string>& cache_names(size_t n) {
    static std::vector<std::string> names;
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    while (names.size() < n) names.push_back("kv_cache." + std::to_string(names.size()));
    return names;
}
}  // namespace

MlaStepCheck::MlaStepCheck(const ov::OutputVector& args, int64_t vocab_size, int64_t max_positions)
    : Op(args), m_vocab_size(vocab_size), m_max_positions(max_positions) {
    constructor_validate_and_infer_types();
}

void MlaStepCheck::validate_and_infer_types() {
    NODE_VALIDATION_CHECK(this, get_input_size() >= kStepMeta + 1, "MlaStepCheck takes the 7 metadata inputs and ",
                          "at least one kv_cache, got ", get_input_size(), " inputs");
    NODE_VALIDATION_CHECK(this, m_vocab_size > 0 && m_max_positions > 0,
                          "MlaStepCheck attributes vocab_size and max_positions must be positive, got ", m_vocab_size,
                          " and ", m_max_positions);
    for (size_t i = 0; i < 3; ++i) set_output_type(i, get_input_element_type(i), get_input_partial_shape(i));
}

std::shared_ptr<ov::Node> MlaStepCheck::clone_with_new_inputs(const ov::OutputVector& args) const {
    return std::make_shared<MlaStepCheck>(args, m_vocab_size, m_max_positions);
}

bool MlaStepCheck::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("vocab_size", m_vocab_size);
    visitor.on_attribute("max_positions", m_max_positions);
    return true;
}

bool MlaStepCheck::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    return recorded([&] {
        mla::StepInputs in{view(inputs[0], kStepNames[0]), view(inputs[1], kStepNames[1]), view(inputs[2], kStepNames[2]),
                           view(inputs[3], kStepNames[3]), view(inputs[4], kStepNames[4]), view(inputs[5], kStepNames[5]),
                           view(inputs[6], kStepNames[6])};
        const auto& names = cache_names(inputs.size() - kStepMeta);
        std::vector<mla::TensorView> caches;
        for (size_t i = kStepMeta; i < inputs.size(); ++i) caches.push_back(view(inputs[i], names[i - kStepMeta].c_str()));
        mla::step_check(in, caches, m_vocab_size, m_max_positions);
        for (size_t i = 0; i < 3; ++i) {
            outputs[i].set_shape(inputs[i].get_shape());
            std::memcpy(outputs[i].data(), inputs[i].data(), inputs[i].get_byte_size());
        }
    });
}

// ---------------------------------------------------------------- MlaMoeExperts

MlaMoeExperts::MlaMoeExperts(const ov::OutputVector& args, int64_t w13_bits, int64_t w2_bits, std::string compute,
                             ZeroPointScan::Bytes inherited)
    : Op(args), m_w13_bits(w13_bits), m_w2_bits(w2_bits), m_compute(std::move(compute)) {
    m_zp.inherited = std::move(inherited);
    constructor_validate_and_infer_types();
}

void MlaMoeExperts::validate_and_infer_types() {
    NODE_VALIDATION_CHECK(this, get_input_size() == 9, "MlaMoeExperts takes 9 inputs, got ", get_input_size());
    read_i64_indices(this, {1});  // topk_ids
    NODE_VALIDATION_CHECK(this, mla::weight_bits_valid(m_w13_bits), "MlaMoeExperts attribute 'w13_bits' must be ",
                          mla::kWeightBitsExpected, ", got ", m_w13_bits);
    NODE_VALIDATION_CHECK(this, mla::weight_bits_valid(m_w2_bits), "MlaMoeExperts attribute 'w2_bits' must be ",
                          mla::kWeightBitsExpected, ", got ", m_w2_bits);
    check_compute(this, m_compute);
    try {
        m_zp.update(*this, mla::int4_zero_point_inputs(mla::MoeBits{m_w13_bits, m_w2_bits}));
    } catch (const mla::Error& e) {
        NODE_VALIDATION_CHECK(this, false, e.what());
    }
    const auto& x = get_input_partial_shape(0);
    ov::PartialShape out = ov::PartialShape::dynamic(2);
    if (x.rank().is_static() && x.rank().get_length() == 2) out = x;
    set_output_type(0, ov::element::f32, out);
}

std::shared_ptr<ov::Node> MlaMoeExperts::clone_with_new_inputs(const ov::OutputVector& args) const {
    return std::make_shared<MlaMoeExperts>(args, m_w13_bits, m_w2_bits, m_compute,
                                           m_zp.for_clone(*this, mla::int4_zero_point_inputs(mla::MoeBits{m_w13_bits, m_w2_bits})));
}

bool MlaMoeExperts::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("w13_bits", m_w13_bits);
    visitor.on_attribute("w2_bits", m_w2_bits);
    visitor.on_attribute("compute", m_compute);
    return true;
}

bool MlaMoeExperts::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    return recorded([&] {
        const mla::MoeInputs in{view(inputs[0], "x"),      view(inputs[1], "topk_ids"), view(inputs[2], "topk_weights"),
                                view(inputs[3], "w13_q"),  view(inputs[4], "w13_s"),    view(inputs[5], "w13_zp"),
                                view(inputs[6], "w2_q"),   view(inputs[7], "w2_s"),     view(inputs[8], "w2_zp"),
                                m_zp.checked};
        const mla::MoeBits bits{m_w13_bits, m_w2_bits};
        const mla::MoeShapes s = mla::moe_experts_shapes(in, bits);
        outputs[0].set_shape(ov::Shape{size_t(s.tokens), size_t(s.hidden)});
        mla::moe_experts(in, bits, view(outputs[0], "output"), ov_threading(), mla::compute_from_name("MlaMoeExperts", m_compute));
    });
}

// ---------------------------------------------------------------- MlaQLinear

MlaQLinear::MlaQLinear(const ov::OutputVector& args, int64_t bits, std::string compute, ZeroPointScan::Bytes inherited,
                       std::string layout)
    : Op(args), m_bits(bits), m_compute(std::move(compute)), m_layout(std::move(layout)) {
    m_zp.inherited = std::move(inherited);
    constructor_validate_and_infer_types();
}

void MlaQLinear::validate_and_infer_types() {
    NODE_VALIDATION_CHECK(this, get_input_size() == 4, "MlaQLinear takes 4 inputs, got ", get_input_size());
    NODE_VALIDATION_CHECK(this, mla::weight_bits_valid(m_bits), "MlaQLinear attribute 'bits' must be ",
                          mla::kWeightBitsExpected, ", got ", m_bits);
    check_compute(this, m_compute);
    NODE_VALIDATION_CHECK(this, m_layout == "rows4" || (m_layout == "tile16" && m_bits == 8),
                          "MlaQLinear attribute 'layout' must be rows4, or tile16 with bits 8; got '", m_layout,
                          "' with bits ", m_bits);
    try {
        m_zp.update(*this, mla::int4_zero_point_inputs(m_bits));
    } catch (const mla::Error& e) {
        NODE_VALIDATION_CHECK(this, false, e.what());
    }
    const auto& x = get_input_partial_shape(0);
    const auto& w = get_input_partial_shape(1);
    ov::PartialShape out = ov::PartialShape::dynamic();
    if (x.rank().is_static() && x.rank().get_length() >= 1 && w.rank().is_static() && w.rank().get_length() == 2) {
        out = x;
        out[x.rank().get_length() - 1] = w[0];
    }
    set_output_type(0, ov::element::f32, out);
}

std::shared_ptr<ov::Node> MlaQLinear::clone_with_new_inputs(const ov::OutputVector& args) const {
    return std::make_shared<MlaQLinear>(args, m_bits, m_compute, m_zp.for_clone(*this, mla::int4_zero_point_inputs(m_bits)),
                                        m_layout);
}

bool MlaQLinear::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("bits", m_bits);
    visitor.on_attribute("compute", m_compute);
    visitor.on_attribute("layout", m_layout);
    return true;
}

bool MlaQLinear::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    return recorded([&] {
        const mla::QLinearInputs in{view(inputs[0], "x"), view(inputs[1], "w_q"), view(inputs[2], "w_s"),
                                    view(inputs[3], "w_zp"), m_zp.checked, mla::qlinear_tile16_from_name(m_layout)};
        const std::vector<int64_t> shape = mla::qlinear_shape(in, m_bits);
        outputs[0].set_shape(ov::Shape(shape.begin(), shape.end()));
        mla::qlinear(in, m_bits, view(outputs[0], "output"), ov_threading(), mla::compute_from_name("MlaQLinear", m_compute));
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
    static const char* const names[] = {"input_ids", "positions", "slot_mapping", "query_start_loc",
                                        "seq_lens", "block_tables", "logits_indices"};
    try {
        mla::TensorView v[7];
        for (int i = 0; i < 7; ++i) {
            v[i].name = names[i];
            v[i].data = const_cast<int32_t*>(arrays[i]);
            v[i].dtype = mla::DType::i32;
            v[i].shape = {lengths[i]};
        }
        v[5].shape = {lengths[5], block_width};
        static float dummy = 0.f;  // never read: the check looks at the caches' shapes only
        std::vector<std::string> cache_names;
        for (int64_t i = 0; i < num_layers; ++i) cache_names.push_back("kv_cache." + std::to_string(i));
        std::vector<mla::TensorView> caches(static_cast<size_t>(num_layers));
        for (int64_t i = 0; i < num_layers; ++i) {
            caches[i].name = cache_names[i].c_str();
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
