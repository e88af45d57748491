// The MLA kernels as an onnxruntime custom-op library (domain "mla_export", opset 1).
//
// A thin wrapper: each op translates its OrtValues into mla::TensorView and calls the plain C++
// kernels of ../kernels (the same code the OpenVINO extension runs), which validate every input
// and throw mla::Error naming the input; that message is returned to onnxruntime as an
// INVALID_ARGUMENT status.
//
// Built against Debian's libonnxruntime-dev headers (see tools/fetch_ort_headers.sh) with
// ORT_API_MANUAL_INIT and not linked to libonnxruntime: the API table comes from the runtime
// that loads us (RegisterCustomOps), so any onnxruntime at least as new as the headers works.
//
// Threads: the kernels' parallel-for runs on the session's intra-op thread pool
// (KernelContext_ParallelFor, so SessionOptions.intra_op_num_threads is the one knob). The
// thread count the kernels size their work split by is the session config entry
// "mla_export.num_threads", else env MLA_EXPORT_ORT_THREADS, else hardware_concurrency.
//
// In place: MlaCacheWrite writes through the kv_cache input's buffer. A graph input fed from a
// C-contiguous numpy array of the same element type (or an OrtValue made from one) is that very
// buffer, so the caller's cache is updated.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../kernels/mla_kernels.hpp"
#include "../kernels/qmatmul.hpp"
#include "../kernels/moe_experts.hpp"
#include "../kernels/qlinear.hpp"

namespace {

constexpr const char* kDomain = "mla_export";
constexpr const char* kThreadsConfigKey = "mla_export.num_threads";
constexpr const char* kThreadsEnv = "MLA_EXPORT_ORT_THREADS";

// ------------------------------------------------------------------ tensors

mla::DType dtype_of(ONNXTensorElementDataType t) {
    switch (t) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return mla::DType::f32;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return mla::DType::bf16;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return mla::DType::f16;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return mla::DType::i32;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return mla::DType::i64;
        // A cache of bf16 rows bound as raw bytes [NB, BS, 2 * W] (the exported graphs declare
        // bf16 caches this way for OpenVINO; the same graph runs here).
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return mla::DType::u8;
        default: return mla::DType::other;
    }
}

mla::TensorView input_view(Ort::KernelContext& ctx, size_t index, const char* name) {
    Ort::ConstValue v = ctx.GetInput(index);
    if (!v) throw mla::Error(std::string("input '") + name + "' is missing");
    if (!v.IsTensor()) throw mla::Error(std::string("input '") + name + "' must be a tensor");
    auto info = v.GetTensorTypeAndShapeInfo();
    mla::TensorView t;
    t.name = name;
    t.dtype = dtype_of(info.GetElementType());
    t.shape = info.GetShape();
    // MlaCacheWrite writes through this pointer (the caller's cache buffer).
    t.data = const_cast<void*>(v.GetTensorRawData());
    return t;
}

mla::TensorView output_view(Ort::UnownedValue& v, const char* name) {
    auto info = v.GetTensorTypeAndShapeInfo();
    mla::TensorView t;
    t.name = name;
    t.dtype = dtype_of(info.GetElementType());
    t.shape = info.GetShape();
    t.data = v.GetTensorMutableRawData();
    return t;
}

// ------------------------------------------------------------------ threads

int default_num_threads() {
    if (const char* env = std::getenv(kThreadsEnv)) {
        const int n = std::atoi(env);
        if (n > 0) return n;
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw > 0 ? static_cast<int>(hw) : 1;
}

struct ForState {
    const std::function<void(int64_t)>* body;
    std::mutex mutex;
    std::exception_ptr error;
};

void run_one(void* user, size_t i) {
    auto* st = static_cast<ForState*>(user);
    try {
        (*st->body)(static_cast<int64_t>(i));
    } catch (...) {  // never let an exception cross onnxruntime's thread pool
        std::lock_guard<std::mutex> lock(st->mutex);
        if (!st->error) st->error = std::current_exception();
    }
}

mla::Threading ort_threading(const OrtKernelContext* raw, int num_threads) {
    mla::Threading th;
    th.parallel_for = [raw](int64_t n, const std::function<void(int64_t)>& body) {
        if (n <= 0) return;
        if (n == 1) {
            body(0);
            return;
        }
        ForState st;
        st.body = &body;
        // num_batch = n: every index is its own task, spread over the session's intra-op pool.
        Ort::ThrowOnError(Ort::GetApi().KernelContext_ParallelFor(raw, run_one, static_cast<size_t>(n),
                                                                  static_cast<size_t>(n), &st));
        if (st.error) std::rethrow_exception(st.error);
    };
    th.num_threads = num_threads;
    return th;
}

// ------------------------------------------------------------------ statuses

// Runs fn, turning every exception into an OrtStatus (nullptr on success).
template <typename Fn>
OrtStatusPtr guarded(const char* op, Fn&& fn) {
    try {
        fn();
        return nullptr;
    } catch (const mla::Error& e) {
        return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, e.what());
    } catch (const Ort::Exception& e) {
        return Ort::GetApi().CreateStatus(e.GetOrtErrorCode(), (std::string(op) + ": " + e.what()).c_str());
    } catch (const std::exception& e) {
        return Ort::GetApi().CreateStatus(ORT_RUNTIME_EXCEPTION, (std::string(op) + ": " + e.what()).c_str());
    } catch (...) {
        return Ort::GetApi().CreateStatus(ORT_RUNTIME_EXCEPTION, (std::string(op) + ": unknown error").c_str());
    }
}

// A required float attribute.
float float_attr(const OrtApi& api, const OrtKernelInfo* info, const char* op, const char* name) {
    float value = 0.f;
    if (OrtStatus* st = api.KernelInfoGetAttribute_float(info, name, &value)) {
        api.ReleaseStatus(st);
        throw mla::Error(std::string(op) + ": the float attribute '" + name + "' is required");
    }
    return value;
}

// An int attribute, or `fallback` when the node does not have it.
int64_t int_attr(const OrtApi& api, const OrtKernelInfo* info, const char* name, int64_t fallback) {
    int64_t value = fallback;
    if (OrtStatus* st = api.KernelInfoGetAttribute_int64(info, name, &value)) {
        api.ReleaseStatus(st);
        return fallback;
    }
    return value;
}

// An optional string attribute (`fallback` when absent; a present one as it is, even "").
std::string string_attr(const OrtApi& api, const OrtKernelInfo* info, const char* op, const char* name,
                        const char* fallback = "") {
    size_t size = 0;
    if (OrtStatus* st = api.KernelInfoGetAttribute_string(info, name, nullptr, &size)) {
        api.ReleaseStatus(st);
        return fallback;
    }
    std::string value(size, '\0');
    if (OrtStatus* st = api.KernelInfoGetAttribute_string(info, name, value.data(), &size)) {
        api.ReleaseStatus(st);
        throw mla::Error(std::string(op) + ": cannot read the string attribute '" + name + "'");
    }
    value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
    return value;
}

// The optional string attribute 'compute' by the kernels' one check (the OpenVINO ops use the
// same): absent = "f32", as in OpenVINO; any other value than "f32" or "bf16" (even "") is refused.
mla::Compute compute_attr(const OrtApi& api, const OrtKernelInfo* info, const char* op) {
    return mla::compute_from_name(op, string_attr(api, info, op, "compute", "f32"));
}

// The cache's row format from the optional string attribute 'kv_dtype' (absent = "": by the
// cache's element type, u8 bytes = bf16 rows; see kernels/cache_format.hpp).
mla::KvDtype kv_dtype_attr(const OrtApi& api, const OrtKernelInfo* info, const char* op) {
    return mla::kv_dtype_from_name(op, string_attr(api, info, op, "kv_dtype"));
}

// int4 zero points given as constant initializers, scanned once when the kernel is made (a bad
// one fails the session's creation, naming the input) instead of on every call (a V2-Lite MoE
// layer's 4.3 MB each time). A call skips the scan only when its inputs are those very buffers.
struct ConstantZeroPoints {
    std::vector<std::pair<size_t, const void*>> scanned;  // (input index, data) of each scanned one
    bool all_constant = false;

    void scan(const OrtApi& api, const OrtKernelInfo* info, const char* op,
              const std::vector<std::pair<size_t, const char*>>& inputs) {
        for (const auto& [index, name] : inputs) {
            int is_constant = 0;
            const OrtValue* value = nullptr;
            if (OrtStatus* st = api.KernelInfoGetConstantInput_tensor(info, index, &is_constant, &value)) {
                api.ReleaseStatus(st);
                return;
            }
            if (!is_constant || value == nullptr) return;
            Ort::ConstValue v{value};
            auto ti = v.GetTensorTypeAndShapeInfo();
            if (ti.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) return;  // the kernel names it per call
            mla::TensorView t;
            t.name = name;
            t.dtype = mla::DType::u8;
            t.shape = ti.GetShape();
            t.data = const_cast<void*>(v.GetTensorRawData());
            mla::check_int4_zero_points(op, t);
            scanned.emplace_back(index, t.data);
        }
        all_constant = !inputs.empty();
    }
    bool covers(Ort::KernelContext& ctx) const {
        if (!all_constant) return false;
        for (const auto& [index, data] : scanned)
            if (ctx.GetInput(index).GetTensorRawData() != data) return false;
        return true;
    }
};

// ------------------------------------------------------------------ op base

// Inputs whose type the kernel validates itself are declared UNDEFINED (any type). The output of
// the attention ops has q's type, which onnxruntime can only infer from a typed input, so those
// ops are registered once per query type (f32, f16, bf16).
template <typename TOp, typename TKernel>
struct MlaOp : Ort::CustomOpBase<TOp, TKernel, /*WithStatus=*/true> {
    explicit MlaOp(int num_threads, ONNXTensorElementDataType q_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
        : num_threads_(num_threads), q_type_(q_type) {}
    const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
    OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
        return index >= TOp::kRequiredInputs ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
    }
    OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
        return guarded(TOp::kName, [&] { *kernel = new TKernel(api, info, num_threads_); });
    }

    int num_threads_;
    ONNXTensorElementDataType q_type_;
};

// ------------------------------------------------------------------ MlaCacheWrite

struct CacheWriteKernel {
    CacheWriteKernel(const OrtApi& api, const OrtKernelInfo* info, int num_threads)
        : kv_dtype_(kv_dtype_attr(api, info, "MlaCacheWrite")), num_threads_(num_threads) {}
    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return guarded("MlaCacheWrite", [&] {
            Ort::KernelContext ctx(context);
            int64_t written = 0;
            ws_.use([&](mla::Workspace& ws) {
                written = mla::cache_write(input_view(ctx, 0, "kv_c"), input_view(ctx, 1, "k_pe"),
                                           input_view(ctx, 2, "kv_cache"), input_view(ctx, 3, "slot_mapping"),
                                           ort_threading(context, num_threads_), kv_dtype_, ws);
            });
            const int64_t shape[1] = {1};
            auto out = ctx.GetOutput(0, shape, 1);
            out.GetTensorMutableData<int32_t>()[0] = static_cast<int32_t>(written);
        });
    }
    mla::KvDtype kv_dtype_;
    int num_threads_;
    mla::OpWorkspace ws_;  // reused across ComputeV2 calls
};

struct CacheWriteOp : MlaOp<CacheWriteOp, CacheWriteKernel> {
    static constexpr const char* kName = "MlaCacheWrite";
    static constexpr size_t kRequiredInputs = 4;  // no optional input: index 4 never asked
    using MlaOp::MlaOp;
    const char* GetName() const { return kName; }
    size_t GetInputTypeCount() const { return 4; }
    ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
    size_t GetOutputTypeCount() const { return 1; }
    ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32; }
};

// ------------------------------------------------------------------ MlaPagedDecode

struct DecodeKernel {
    DecodeKernel(const OrtApi& api, const OrtKernelInfo* info, int num_threads)
        : scale_(float_attr(api, info, "MlaPagedDecode", "scale")),
          kv_lora_rank_(int_attr(api, info, "kv_lora_rank", -1)),  // required: no model's r is a default
          kv_dtype_(kv_dtype_attr(api, info, "MlaPagedDecode")),
          num_threads_(num_threads) {
        if (kv_lora_rank_ == -1)
            throw mla::Error("MlaPagedDecode: attribute 'kv_lora_rank' (the latent rank r) is required");
        if (kv_lora_rank_ <= 0)
            throw mla::Error("MlaPagedDecode: attribute 'kv_lora_rank' must be positive, got " +
                             std::to_string(kv_lora_rank_));
    }
    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return guarded("MlaPagedDecode", [&] {
            Ort::KernelContext ctx(context);
            const auto q = input_view(ctx, 0, "q"), cache = input_view(ctx, 1, "kv_cache");
            const auto bt = input_view(ctx, 2, "block_tables"), lens = input_view(ctx, 3, "seq_lens");
            const mla::DecodePlan plan = mla::plan_decode(q, cache, bt, lens, scale_, kv_lora_rank_, kv_dtype_);
            const int64_t shape[3] = {plan.shapes.batch, plan.shapes.heads, plan.shapes.rank};
            auto out = ctx.GetOutput(0, shape, 3);
            const auto out_view = output_view(out, "output");
            ws_.use([&](mla::Workspace& ws) {
                mla::run_decode(plan, out_view, ort_threading(context, num_threads_), ws);
            });
        });
    }
    float scale_;
    int64_t kv_lora_rank_;
    mla::KvDtype kv_dtype_;
    int num_threads_;
    mla::OpWorkspace ws_;  // reused across ComputeV2 calls
};

struct DecodeOp : MlaOp<DecodeOp, DecodeKernel> {
    static constexpr const char* kName = "MlaPagedDecode";
    static constexpr size_t kRequiredInputs = 4;
    using MlaOp::MlaOp;
    const char* GetName() const { return kName; }
    size_t GetInputTypeCount() const { return 5; }
    ONNXTensorElementDataType GetInputType(size_t i) const {
        return i == 0 ? q_type_ : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    }
    size_t GetOutputTypeCount() const { return 1; }
    ONNXTensorElementDataType GetOutputType(size_t) const { return q_type_; }
};

// ------------------------------------------------------------------ MlaPagedAttention

struct AttentionKernel {
    AttentionKernel(const OrtApi& api, const OrtKernelInfo* info, int num_threads)
        : scale_(float_attr(api, info, "MlaPagedAttention", "scale")),
          form_(int_attr(api, info, "form", 0)),
          kv_dtype_(kv_dtype_attr(api, info, "MlaPagedAttention")),
          bf16_products_(compute_attr(api, info, "MlaPagedAttention") ==
                         mla::Compute::bf16),
          num_threads_(num_threads) {
        if (form_ < 0 || form_ > 2)
            throw mla::Error("MlaPagedAttention attribute 'form' must be 0 (auto), 1 (absorbed) or 2 (expanded), got " +
                             std::to_string(form_));
    }
    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return guarded("MlaPagedAttention", [&] {
            Ort::KernelContext ctx(context);
            const auto qn = input_view(ctx, 0, "q_nope"), qp = input_view(ctx, 1, "q_pe");
            const auto cache = input_view(ctx, 2, "kv_cache");
            const auto wuk = input_view(ctx, 3, "w_uk"), wuv = input_view(ctx, 4, "w_uv");
            const auto qsl = input_view(ctx, 5, "query_start_loc"), lens = input_view(ctx, 6, "seq_lens");
            const auto bt = input_view(ctx, 7, "block_tables");
            // topk_indices (sparse attention) is the optional input after the ordering one.
            const bool sparse = ctx.GetInputCount() > 9 && ctx.GetInput(9);
            mla::TensorView topk;
            if (sparse) topk = input_view(ctx, 9, "topk_indices");
            mla::AttentionPlan plan = mla::plan_attention(qn, qp, cache, wuk, wuv, qsl, lens, bt, scale_,
                                                          static_cast<mla::Form>(form_), kv_dtype_,
                                                          sparse ? &topk : nullptr);
            plan.bf16_products = bf16_products_;
            const int64_t shape[3] = {plan.shapes.tokens, plan.shapes.heads, plan.shapes.v_dim};
            auto out = ctx.GetOutput(0, shape, 3);
            const auto out_view = output_view(out, "output");
            ws_.use([&](mla::Workspace& ws) {
                mla::run_attention(plan, out_view, ort_threading(context, num_threads_), ws);
            });
        });
    }
    float scale_;
    int64_t form_;
    mla::KvDtype kv_dtype_;
    bool bf16_products_;
    int num_threads_;
    mla::OpWorkspace ws_;  // reused across ComputeV2 calls
};

struct AttentionOp : MlaOp<AttentionOp, AttentionKernel> {
    static constexpr const char* kName = "MlaPagedAttention";
    static constexpr size_t kRequiredInputs = 8;
    using MlaOp::MlaOp;
    const char* GetName() const { return kName; }
    size_t GetInputTypeCount() const { return 10; }  // + after, topk_indices (both optional)
    ONNXTensorElementDataType GetInputType(size_t i) const {
        return i == 0 ? q_type_ : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    }
    size_t GetOutputTypeCount() const { return 1; }
    ONNXTensorElementDataType GetOutputType(size_t) const { return q_type_; }
};

// ------------------------------------------------------------------ MlaIndexerTopK

struct IndexerKernel {
    IndexerKernel(const OrtApi& api, const OrtKernelInfo* info, int num_threads)
        : topk_(int_attr(api, info, "topk", 0)),
          kv_dtype_(kv_dtype_attr(api, info, "MlaIndexerTopK")),
          bf16_products_(compute_attr(api, info, "MlaIndexerTopK") ==
                         mla::Compute::bf16),
          num_threads_(num_threads) {
        if (topk_ < 1) throw mla::Error("MlaIndexerTopK attribute 'topk' must be >= 1, got " + std::to_string(topk_));
    }
    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return guarded("MlaIndexerTopK", [&] {
            Ort::KernelContext ctx(context);
            const auto q = input_view(ctx, 0, "q"), w = input_view(ctx, 1, "weights");
            const auto cache = input_view(ctx, 2, "index_cache");
            const auto qsl = input_view(ctx, 3, "query_start_loc"), lens = input_view(ctx, 4, "seq_lens");
            const auto bt = input_view(ctx, 5, "block_tables");
            mla::IndexerPlan plan = mla::plan_indexer(q, w, cache, qsl, lens, bt, topk_, kv_dtype_);
            plan.bf16_products = bf16_products_;
            const int64_t shape[2] = {plan.tokens, plan.topk};
            auto out = ctx.GetOutput(0, shape, 2);
            const auto out_view = output_view(out, "output");
            ws_.use([&](mla::Workspace& ws) { mla::run_indexer(plan, out_view, ort_threading(context, num_threads_), ws); });
        });
    }
    int64_t topk_;
    mla::KvDtype kv_dtype_;
    bool bf16_products_;
    int num_threads_;
    mla::OpWorkspace ws_;
};

struct IndexerOp : MlaOp<IndexerOp, IndexerKernel> {
    static constexpr const char* kName = "MlaIndexerTopK";
    static constexpr size_t kRequiredInputs = 6;
    using MlaOp::MlaOp;
    const char* GetName() const { return kName; }
    size_t GetInputTypeCount() const { return 7; }
    ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
    size_t GetOutputTypeCount() const { return 1; }
    ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32; }
};

// ------------------------------------------------------------------ MlaStepCheck

// input_ids, positions, slot_mapping, query_start_loc, seq_lens, block_tables, logits_indices,
// kv_cache.0 .. (variadic) -> copies of input_ids, positions, slot_mapping once the step passed.
struct StepCheckKernel {
    StepCheckKernel(const OrtApi& api, const OrtKernelInfo* info, int)
        : vocab_size_(int_attr(api, info, "vocab_size", 0)), max_positions_(int_attr(api, info, "max_positions", 0)) {
        if (vocab_size_ <= 0 || max_positions_ <= 0)
            throw mla::Error("MlaStepCheck: attributes 'vocab_size' and 'max_positions' must be positive, got " +
                             std::to_string(vocab_size_) + " and " + std::to_string(max_positions_));
    }
    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return guarded("MlaStepCheck", [&] {
            static const char* const names[] = {"input_ids", "positions", "slot_mapping", "query_start_loc",
                                                "seq_lens", "block_tables", "logits_indices"};
            Ort::KernelContext ctx(context);
            mla::StepInputs in{input_view(ctx, 0, names[0]), input_view(ctx, 1, names[1]),
                               input_view(ctx, 2, names[2]), input_view(ctx, 3, names[3]),
                               input_view(ctx, 4, names[4]), input_view(ctx, 5, names[5]),
                               input_view(ctx, 6, names[6])};
            const size_t n = ctx.GetInputCount();
            std::vector<std::string> cache_names;
            for (size_t i = 7; i < n; ++i) cache_names.push_back("kv_cache." + std::to_string(i - 7));
            std::vector<mla::TensorView> caches;
            for (size_t i = 7; i < n; ++i) caches.push_back(input_view(ctx, i, cache_names[i - 7].c_str()));
            mla::step_check(in, caches, vocab_size_, max_positions_);
            const mla::TensorView* pass[] = {&in.input_ids, &in.positions, &in.slot_mapping};
            for (size_t i = 0; i < 3; ++i) {
                if (pass[i]->dtype != mla::DType::i32)
                    throw mla::Error(std::string("MlaStepCheck: input '") + pass[i]->name + "' must be i32");
                auto out = ctx.GetOutput(i, pass[i]->shape.data(), pass[i]->shape.size());
                std::memcpy(out.GetTensorMutableRawData(), pass[i]->data, size_t(pass[i]->numel()) * sizeof(int32_t));
            }
        });
    }
    int64_t vocab_size_, max_positions_;
};

struct StepCheckOp : Ort::CustomOpBase<StepCheckOp, StepCheckKernel, /*WithStatus=*/true> {
    static constexpr const char* kName = "MlaStepCheck";
    const char* GetName() const { return kName; }
    const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
    OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
        return guarded(kName, [&] { *kernel = new StepCheckKernel(api, info, 1); });
    }
    size_t GetInputTypeCount() const { return 8; }  // 7 metadata + the caches (variadic)
    ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
    OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
        return index == 7 ? INPUT_OUTPUT_VARIADIC : INPUT_OUTPUT_REQUIRED;
    }
    int GetVariadicInputMinArity() const { return 1; }
    bool GetVariadicInputHomogeneity() const { return false; }
    size_t GetOutputTypeCount() const { return 3; }
    ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32; }
};

// ------------------------------------------------------------------ MlaMoeExperts

struct MoeExpertsKernel {
    MoeExpertsKernel(const OrtApi& api, const OrtKernelInfo* info, int num_threads)
        : bits_{int_attr(api, info, "w13_bits", 0), int_attr(api, info, "w2_bits", 0)},
          compute_(compute_attr(api, info, "MlaMoeExperts")),
          num_threads_(num_threads) {
        for (auto [name, b] : {std::make_pair("w13_bits", bits_.w13), std::make_pair("w2_bits", bits_.w2)})
            if (!mla::weight_bits_valid(b))
                throw mla::Error(std::string("MlaMoeExperts: attribute '") + name + "' must be " +
                                 mla::kWeightBitsExpected + ", got " + std::to_string(b));
        zero_points_.scan(api, info, "MlaMoeExperts", mla::int4_zero_point_inputs(bits_));
    }
    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return guarded("MlaMoeExperts", [&] {
            Ort::KernelContext ctx(context);
            const mla::MoeInputs in{input_view(ctx, 0, "x"),     input_view(ctx, 1, "topk_ids"),
                                    input_view(ctx, 2, "topk_weights"), input_view(ctx, 3, "w13_q"),
                                    input_view(ctx, 4, "w13_s"), input_view(ctx, 5, "w13_zp"),
                                    input_view(ctx, 6, "w2_q"),  input_view(ctx, 7, "w2_s"),
                                    input_view(ctx, 8, "w2_zp"), zero_points_.covers(ctx)};
            const mla::MoeShapes s = mla::moe_experts_shapes(in, bits_);
            const int64_t shape[2] = {s.tokens, s.hidden};
            auto out = ctx.GetOutput(0, shape, 2);
            mla::moe_experts(in, bits_, output_view(out, "output"), ort_threading(context, num_threads_), compute_);
        });
    }
    mla::MoeBits bits_;
    mla::Compute compute_;
    int num_threads_;
    ConstantZeroPoints zero_points_;
};

struct MoeExpertsOp : MlaOp<MoeExpertsOp, MoeExpertsKernel> {
    static constexpr const char* kName = "MlaMoeExperts";
    static constexpr size_t kRequiredInputs = 9;  // no optional input
    using MlaOp::MlaOp;
    const char* GetName() const { return kName; }
    size_t GetInputTypeCount() const { return 9; }
    ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
    size_t GetOutputTypeCount() const { return 1; }
    ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

// ------------------------------------------------------------------ MlaQLinear

struct QLinearKernel {
    QLinearKernel(const OrtApi& api, const OrtKernelInfo* info, int num_threads)
        : bits_(int_attr(api, info, "bits", 0)),
          compute_(compute_attr(api, info, "MlaQLinear")),
          num_threads_(num_threads) {
        const std::string layout = string_attr(api, info, "MlaQLinear", "layout");
        tile16_ = mla::qlinear_tile16_from_name(layout.empty() ? "rows4" : layout);
        if (!mla::weight_bits_valid(bits_))
            throw mla::Error(std::string("MlaQLinear: attribute 'bits' must be ") + mla::kWeightBitsExpected + ", got " +
                             std::to_string(bits_));
        zero_points_.scan(api, info, "MlaQLinear", mla::int4_zero_point_inputs(bits_));
    }
    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return guarded("MlaQLinear", [&] {
            Ort::KernelContext ctx(context);
            const mla::QLinearInputs in{input_view(ctx, 0, "x"), input_view(ctx, 1, "w_q"), input_view(ctx, 2, "w_s"),
                                        input_view(ctx, 3, "w_zp"), zero_points_.covers(ctx), tile16_};
            const std::vector<int64_t> shape = mla::qlinear_shape(in, bits_);
            auto out = ctx.GetOutput(0, shape.data(), shape.size());
            mla::qlinear(in, bits_, output_view(out, "output"), ort_threading(context, num_threads_), compute_);
        });
    }
    int64_t bits_;
    mla::Compute compute_;
    int num_threads_;
    bool tile16_ = false;
    ConstantZeroPoints zero_points_;
};

struct QLinearOp : MlaOp<QLinearOp, QLinearKernel> {
    static constexpr const char* kName = "MlaQLinear";
    static constexpr size_t kRequiredInputs = 4;
    using MlaOp::MlaOp;
    const char* GetName() const { return kName; }
    size_t GetInputTypeCount() const { return 4; }
    ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
    size_t GetOutputTypeCount() const { return 1; }
    ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

// ------------------------------------------------------------------ registration

// onnxruntime keeps raw pointers to the ops and the domain for as long as any session that was
// given them lives, which this library cannot know: keep every registration until unload.
struct Registration {
    Ort::CustomOpDomain domain{nullptr};
    std::vector<std::unique_ptr<OrtCustomOp>> ops;
};
std::mutex g_mutex;
std::vector<std::unique_ptr<Registration>>& registrations() {
    static auto* regs = new std::vector<std::unique_ptr<Registration>>();  // never destroyed
    return *regs;
}

int threads_for(const OrtSessionOptions* options) {
    Ort::ConstSessionOptions so(options);
    if (so.HasConfigEntry(kThreadsConfigKey)) {
        const std::string v = so.GetConfigEntry(kThreadsConfigKey);
        const int n = std::atoi(v.c_str());
        if (n <= 0)
            throw mla::Error(std::string("session config '") + kThreadsConfigKey + "' must be a positive integer, got '" +
                             v + "'");
        return n;
    }
    return default_num_threads();
}

}  // namespace

extern "C" {

// Called by SessionOptions.register_custom_ops_library / RegisterCustomOpsLibrary_V2.
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                               const OrtApiBase* api_base) {
    const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
    if (api == nullptr) {
        // The runtime is older than the headers we were built with: report it through the
        // version-1 API table, which every runtime has.
        const std::string msg = std::string("mla_export: this library was built against onnxruntime API version ") +
                                std::to_string(ORT_API_VERSION) + ", newer than the loading runtime (" +
                                api_base->GetVersionString() + "); rebuild it with older headers";
        return api_base->GetApi(1)->CreateStatus(ORT_FAIL, msg.c_str());
    }
    Ort::InitApi(api);
    return guarded("mla_export RegisterCustomOps", [&] {
        const int threads = threads_for(options);
        auto reg = std::make_unique<Registration>();
        reg->domain = Ort::CustomOpDomain(kDomain);
        reg->ops.push_back(std::make_unique<CacheWriteOp>(threads));
        reg->ops.push_back(std::make_unique<StepCheckOp>());
        reg->ops.push_back(std::make_unique<MoeExpertsOp>(threads));
        reg->ops.push_back(std::make_unique<QLinearOp>(threads));
        reg->ops.push_back(std::make_unique<IndexerOp>(threads));
        for (auto q : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                       ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}) {
            reg->ops.push_back(std::make_unique<DecodeOp>(threads, q));
            reg->ops.push_back(std::make_unique<AttentionOp>(threads, q));
        }
        for (auto& op : reg->ops) reg->domain.Add(op.get());
        Ort::UnownedSessionOptions(options).Add(reg->domain);
        std::lock_guard<std::mutex> lock(g_mutex);
        registrations().push_back(std::move(reg));
    });
}

// The kernel switchboard of this library's copy of the kernels (as the OpenVINO extension's
// MlaExportKernels; mla_export/kernel_config.py configures both).
__attribute__((visibility("default"))) int MlaExportOrtKernels(const char* spec, char* out, size_t out_len) {
    return mla::kernels_call(spec, out, out_len);
}

}  // extern "C"
