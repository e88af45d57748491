// The MLA kernels as an onnxruntime custom-op library (domain "mla_export", opset 1).
//
// A thin wrapper, generic over the op table (custom_ops/op_table): each op translates its OrtValues into mla::TensorView and calls the plain C++
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

#include <algorithm>
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
#include "../op_table/op_runs.hpp"

namespace {

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

// An optional string attribute (`fallback` when absent; a present one as it is, even "").
bool string_attr(const OrtApi& api, const OrtKernelInfo* info, const char* op, const char* name, std::string& value) {
    size_t size = 0;
    if (OrtStatus* st = api.KernelInfoGetAttribute_string(info, name, nullptr, &size)) {
        api.ReleaseStatus(st);
        return false;
    }
    value.assign(size, '\0');
    if (OrtStatus* st = api.KernelInfoGetAttribute_string(info, name, value.data(), &size)) {
        api.ReleaseStatus(st);
        throw mla::Error(std::string(op) + ": cannot read the string attribute '" + name + "'");
    }
    value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
    return true;
}

// The node's attributes by the table (an absent optional one takes the table's default, an
// absent required one stays unset), checked by the table's rules and the op's own.
mla::ops::AttrValues attributes_of(const OrtApi& api, const OrtKernelInfo* info, const mla::ops::OpSpec& op) {
    mla::ops::AttrValues v = mla::ops::default_attrs(op);
    for (int k = 0; k < op.n_attrs; ++k) {
        const mla::ops::AttrSpec& a = op.attrs[k];
        auto& x = v[static_cast<size_t>(k)];
        OrtStatus* st = nullptr;
        if (a.type == mla::ops::AttrType::f32) {
            float f = 0.f;
            st = api.KernelInfoGetAttribute_float(info, a.name, &f);
            if (!st) x.f = f;
        } else if (a.type == mla::ops::AttrType::i64) {
            int64_t i = 0;
            st = api.KernelInfoGetAttribute_int64(info, a.name, &i);
            if (!st) x.i = i;
        } else {
            std::string s;
            if (string_attr(api, info, op.name, a.name, s)) x.s = s;
        }
        if (st) api.ReleaseStatus(st);  // absent: the default (or unset, refused below)
    }
    mla::ops::check_node_attrs(op, v);
    return v;
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

// ------------------------------------------------------------------ any op of the table

// One kernel per node: its checked attributes, its constant zero points, its workspace.
struct TableKernel {
    TableKernel(const OrtApi& api, const OrtKernelInfo* info, const mla::ops::OpSpec& op, int num_threads)
        : op_(op), attrs_(attributes_of(api, info, op)), num_threads_(num_threads) {
        if (const auto zero_points = mla::ops::op_run(op).zero_points)
            zero_points_.scan(api, info, op.name, zero_points(op, attrs_));
    }
    OrtStatusPtr ComputeV2(OrtKernelContext* context) {
        return guarded(op_.name, [&] {
            Ort::KernelContext ctx(context);
            mla::ops::OpCall call{op_, attrs_, {}, nullptr, ort_threading(context, num_threads_), &ws_,
                                  zero_points_.covers(ctx)};
            for (size_t i = 0; i < ctx.GetInputCount(); ++i) {
                const char* name = mla::ops::input_name(op_, i);
                const bool left_out = op_.inputs[std::min<size_t>(i, op_.n_inputs - 1)].optional && !ctx.GetInput(i);
                call.inputs.push_back(left_out ? mla::TensorView{name} : input_view(ctx, i, name));
            }
            call.output = [&](size_t k, const std::vector<int64_t>& shape) {
                auto out = ctx.GetOutput(k, shape.data(), shape.size());
                return output_view(out, "output");
            };
            mla::ops::op_run(op_).run(call);
        });
    }
    const mla::ops::OpSpec& op_;
    mla::ops::AttrValues attrs_;
    int num_threads_;
    ConstantZeroPoints zero_points_;
    mla::OpWorkspace ws_;  // reused across ComputeV2 calls
};

ONNXTensorElementDataType onnx_type(mla::ops::TypeClass t) {
    switch (t) {
        case mla::ops::TypeClass::i32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
        case mla::ops::TypeClass::f32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
        default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    }
}

// The element types of a type class (what an op whose output takes an input's type is registered
// once per: onnxruntime can only infer that output's type from a typed input).
std::vector<ONNXTensorElementDataType> onnx_types(mla::ops::TypeClass t) {
    switch (t) {
        case mla::ops::TypeClass::float_:
            return {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                    ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16};
        case mla::ops::TypeClass::index: return {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64};
        default: return {onnx_type(t)};
    }
}

// An op of the table as an onnxruntime custom op. Inputs whose type the kernel validates itself
// are declared UNDEFINED (any type); the inputs whose type an output takes are declared `type`.
struct TableOp : Ort::CustomOpBase<TableOp, TableKernel, /*WithStatus=*/true> {
    TableOp(const mla::ops::OpSpec& op, int num_threads, ONNXTensorElementDataType type)
        : op_(op), num_threads_(num_threads), type_(type) {}
    const char* GetName() const { return op_.name; }
    const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
    OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
        return guarded(op_.name, [&] { *kernel = new TableKernel(api, info, op_, num_threads_); });
    }
    size_t GetInputTypeCount() const { return static_cast<size_t>(op_.n_inputs); }
    ONNXTensorElementDataType GetInputType(size_t i) const {
        return typed(static_cast<int>(i)) ? type_ : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    }
    OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
        const auto& in = op_.inputs[i];
        return in.variadic ? INPUT_OUTPUT_VARIADIC : in.optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
    }
    int GetVariadicInputMinArity() const { return 1; }
    bool GetVariadicInputHomogeneity() const { return false; }
    size_t GetOutputTypeCount() const { return static_cast<size_t>(op_.n_outputs); }
    ONNXTensorElementDataType GetOutputType(size_t k) const {
        const auto& out = op_.outputs[k];
        return out.like_input >= 0 ? type_ : onnx_type(out.type);
    }
    bool typed(int input) const {
        for (int k = 0; k < op_.n_outputs; ++k)
            if (op_.outputs[k].like_input == input) return true;
        return false;
    }

    const mla::ops::OpSpec& op_;
    int num_threads_;
    ONNXTensorElementDataType type_;  // of the typed inputs and the outputs that take it
};

// Every op of the table; one whose outputs take an input's type once per element type of that
// input's class (the table gives such inputs one class).
void add_table_ops(std::vector<std::unique_ptr<OrtCustomOp>>& ops, int threads) {
    for (const mla::ops::OpSpec& op : mla::ops::kOps) {
        int typed = -1;
        for (int k = 0; k < op.n_outputs; ++k)
            if (op.outputs[k].like_input >= 0) typed = op.outputs[k].like_input;
        if (typed < 0) {
            ops.push_back(std::make_unique<TableOp>(op, threads, ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED));
            continue;
        }
        for (const auto t : onnx_types(op.inputs[typed].type)) ops.push_back(std::make_unique<TableOp>(op, threads, t));
    }
}

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
        reg->domain = Ort::CustomOpDomain(mla::ops::kDomain);
        add_table_ops(reg->ops, threads);
        for (auto& op : reg->ops) reg->domain.Add(op.get());
        Ort::UnownedSessionOptions(options).Add(reg->domain);
        std::lock_guard<std::mutex> lock(g_mutex);
        registrations().push_back(std::move(reg));
    });
}

// The kernel switchboard of this library's copy of the kernels (as the OpenVINO extension's
// MlaExportKernels; mla_export/ops/kernel_config.py configures both).
__attribute__((visibility("default"))) int MlaExportOrtKernels(const char* spec, char* out, size_t out_len) {
    return mla::kernels_call(spec, out, out_len);
}

// The op table this library was built from, as JSON (mla_export.ops checks it against table.json).
__attribute__((visibility("default"))) const char* mla_export_op_table() { return mla::ops::table_json().c_str(); }

}  // extern "C"
