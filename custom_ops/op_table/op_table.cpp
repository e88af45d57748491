#include "op_table.hpp"

#include <cmath>
#include <deque>
#include <limits>
#include <mutex>
#include <sstream>

#include "../kernels/cache_format.hpp"
#include "../kernels/mla_tensor.hpp"
#include "../kernels/weight_format.hpp"

namespace mla::ops {
namespace {

constexpr int64_t kUnsetInt = std::numeric_limits<int64_t>::min();

[[noreturn]] void bad(const OpSpec& op, const AttrSpec& a, const std::string& what) {
    throw Error(std::string(op.name) + ": attribute '" + a.name + "' " + what);
}

// "a, b or c" of the allowed values.
std::string allowed_list(const AttrSpec& a) {
    std::string out;
    for (int k = 0; k < a.n_allowed; ++k) {
        if (k) out += k + 1 == a.n_allowed ? " or " : ", ";
        out += a.type == AttrType::str ? std::string(a.allowed_s[k]) : std::to_string(a.allowed_i[k]);
    }
    return out;
}

const AttrSpec& attr_of(const OpSpec& op, const char* name) {
    const int k = op.attr_index(name);
    if (k < 0) throw Error(std::string(op.name) + " has no attribute '" + name + "'");  // a bug in op_runs.cpp
    return op.attrs[k];
}

std::string json_str(const char* s) {
    std::string out = "\"";
    for (const char* p = s; *p; ++p) {
        if (*p == '"' || *p == '\\') out += '\\';
        out += *p;
    }
    return out + "\"";
}

const char* type_name(TypeClass t) {
    switch (t) {
        case TypeClass::float_: return "float";
        case TypeClass::cache: return "cache";
        case TypeClass::index: return "index";
        case TypeClass::any: return "any";
        case TypeClass::f32: return "f32";
        case TypeClass::u8: return "u8";
        case TypeClass::i32: return "i32";
    }
    return "?";
}

std::string term_json(const OpSpec& op, const DimTerm& t) {
    switch (t.kind) {
        case DimKind::constant: return std::to_string(t.value);
        case DimKind::input_dim: return json_str((std::string(op.inputs[t.ref].name) + "[" + std::to_string(t.axis) + "]").c_str());
        case DimKind::leading: return json_str((std::string(op.inputs[t.ref].name) + "[:-1]").c_str());
        case DimKind::attribute: return json_str((std::string("@") + op.attrs[t.ref].name).c_str());
    }
    return "null";
}

std::string build_json() {
    std::ostringstream o;
    o << "{\"domain\": " << json_str(kDomain) << ", \"opset\": " << kOpset << ", \"ops\": [";
    for (int n = 0; n < kNumOps; ++n) {
        const OpSpec& op = kOps[n];
        o << (n ? ", " : "") << "{\"name\": " << json_str(op.name) << ", \"inputs\": [";
        for (int i = 0; i < op.n_inputs; ++i) {
            const InputSpec& in = op.inputs[i];
            o << (i ? ", " : "") << "{\"name\": " << json_str(in.name) << ", \"type\": " << json_str(type_name(in.type))
              << ", \"rank\": " << (in.rank < 0 ? std::string("null") : std::to_string(in.rank))
              << ", \"optional\": " << (in.optional ? "true" : "false") << ", \"variadic\": " << (in.variadic ? "true" : "false")
              << ", \"exact_i64\": " << (in.exact_i64 ? "true" : "false") << "}";
        }
        o << "], \"attributes\": [";
        for (int k = 0; k < op.n_attrs; ++k) {
            const AttrSpec& a = op.attrs[k];
            o << (k ? ", " : "") << "{\"name\": " << json_str(a.name) << ", \"type\": "
              << (a.type == AttrType::f32 ? "\"float\"" : a.type == AttrType::i64 ? "\"int\"" : "\"string\"");
            if (a.has_default) {
                o << ", \"default\": ";
                if (a.type == AttrType::f32) o << a.default_f;
                else if (a.type == AttrType::i64) o << a.default_i;
                else o << json_str(a.default_s);
            }
            if (a.n_allowed) {
                o << ", \"allowed\": [";
                for (int v = 0; v < a.n_allowed; ++v)
                    o << (v ? ", " : "") << (a.type == AttrType::str ? json_str(a.allowed_s[v]) : std::to_string(a.allowed_i[v]));
                o << "]";
            }
            if (a.has_min) o << ", \"min\": " << a.min;
            if (a.check != AttrCheck::none) o << ", \"check\": " << (a.check == AttrCheck::kv_dtype ? "\"kv_dtype\"" : "\"weight_bits\"");
            o << "}";
        }
        o << "], \"outputs\": [";
        for (int k = 0; k < op.n_outputs; ++k) {
            const OutputSpec& out = op.outputs[k];
            o << (k ? ", " : "") << "{\"name\": " << json_str(out.name) << ", \"type\": "
              << (out.like_input >= 0 ? json_str((std::string("=") + op.inputs[out.like_input].name).c_str())
                                      : json_str(type_name(out.type)))
              << ", \"shape\": [";
            for (int t = 0; t < out.n_terms; ++t) o << (t ? ", " : "") << term_json(op, out.shape[t]);
            o << "]}";
        }
        o << "]}";
    }
    o << "]}";
    return o.str();
}

}  // namespace

size_t OpSpec::required_inputs() const {
    size_t n = 0;
    while (n < size_t(n_inputs) && !inputs[n].optional && !inputs[n].variadic) ++n;
    return n;
}

size_t OpSpec::optional_inputs() const {
    size_t n = 0;
    for (int i = 0; i < n_inputs; ++i) n += inputs[i].optional;
    return n;
}

int OpSpec::attr_index(const char* attr) const {
    for (int k = 0; k < n_attrs; ++k)
        if (std::string(attrs[k].name) == attr) return k;
    return -1;
}

const OpSpec& spec(OpId id) { return kOps[static_cast<int>(id)]; }

const OpSpec* find_op(const std::string& name) {
    for (const OpSpec& op : kOps)
        if (name == op.name) return &op;
    return nullptr;
}

AttrValues default_attrs(const OpSpec& op) {
    AttrValues v(static_cast<size_t>(op.n_attrs));
    for (int k = 0; k < op.n_attrs; ++k) {
        const AttrSpec& a = op.attrs[k];
        v[k].f = a.has_default ? a.default_f : std::numeric_limits<float>::quiet_NaN();
        v[k].i = a.has_default ? a.default_i : kUnsetInt;
        v[k].s = a.default_s;
    }
    return v;
}

void check_attrs(const OpSpec& op, const AttrValues& values) {
    for (int k = 0; k < op.n_attrs; ++k) {
        const AttrSpec& a = op.attrs[k];
        const AttrValue& v = values.at(static_cast<size_t>(k));
        if ((a.type == AttrType::f32 && std::isnan(v.f)) || (a.type == AttrType::i64 && v.i == kUnsetInt))
            bad(op, a, "is required");
        if (a.n_allowed) {
            bool ok = false;
            for (int m = 0; m < a.n_allowed; ++m)
                ok = ok || (a.type == AttrType::str ? v.s == a.allowed_s[m] : v.i == a.allowed_i[m]);
            if (!ok) bad(op, a, "must be " + allowed_list(a) + ", got " + (a.type == AttrType::str ? "'" + v.s + "'" : std::to_string(v.i)));
        }
        if (a.has_min && v.i < a.min) bad(op, a, "must be >= " + std::to_string(a.min) + ", got " + std::to_string(v.i));
        if (a.check == AttrCheck::kv_dtype) kv_dtype_from_name(op.name, v.s);
        if (a.check == AttrCheck::weight_bits && !weight_bits_valid(v.i))
            bad(op, a, std::string("must be ") + kWeightBitsExpected + ", got " + std::to_string(v.i));
    }
}

float attr_f(const OpSpec& op, const AttrValues& values, const char* name) {
    attr_of(op, name);
    return values.at(static_cast<size_t>(op.attr_index(name))).f;
}
int64_t attr_i(const OpSpec& op, const AttrValues& values, const char* name) {
    attr_of(op, name);
    return values.at(static_cast<size_t>(op.attr_index(name))).i;
}
const std::string& attr_s(const OpSpec& op, const AttrValues& values, const char* name) {
    attr_of(op, name);
    return values.at(static_cast<size_t>(op.attr_index(name))).s;
}

const char* input_name(const OpSpec& op, size_t i) {
    const size_t last = static_cast<size_t>(op.n_inputs) - 1;
    if (!op.variadic() || i < last) return i < size_t(op.n_inputs) ? op.inputs[i].name : "(extra input)";
    // The variadic input's tensors: names that live as long as the process (views point at them).
    static std::mutex mutex;
    static std::deque<std::deque<std::string>> names(kNumOps);
    std::lock_guard<std::mutex> lock(mutex);
    auto& mine = names[static_cast<size_t>(&op - kOps)];
    while (mine.size() <= i - last) mine.push_back(std::string(op.inputs[last].name) + "." + std::to_string(mine.size()));
    return mine[i - last].c_str();
}

const std::string& table_json() {
    static const std::string json = build_json();
    return json;
}

}  // namespace mla::ops
