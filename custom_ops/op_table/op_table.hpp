// The mla_export ops as data: each op's name, inputs (name, type class, rank, optional /
// variadic), attributes (name, type, default, allowed values, bounds) and outputs (type and
// shape rule). The descriptors themselves are generated from mla_export/ops/table.json (the one
// declaration, which Python reads too) into op_table.gen.hpp; the OpenVINO and onnxruntime
// adapters are generic code that reads them (op_runs.hpp holds each op's run function).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mla::ops {

// An input's or output's element types (the names mla_export/ops/table.json "types" gives).
enum class TypeClass { float_, cache, index, any, f32, u8, i32 };

struct InputSpec {
    const char* name;
    TypeClass type;
    int rank;        // -1: any
    bool optional;   // may be left out (only after every required input)
    bool variadic;   // the last input, one or more of it
    bool exact_i64;  // an index read as given (OpenVINO: past the CPU plugin's i64 -> i32 Convert)
};

enum class AttrType { f32, i64, str };
// A rule the kernels own (their one check, named here so the adapters call it when the graph is built).
enum class AttrCheck { none, kv_dtype, weight_bits };

struct AttrSpec {
    const char* name;
    AttrType type;
    bool has_default;  // false: required
    float default_f;
    int64_t default_i;
    const char* default_s;
    int n_allowed;                // 0: any value
    const int64_t* allowed_i;     // int attributes
    const char* const* allowed_s; // string attributes
    bool has_min;
    int64_t min;
    AttrCheck check;
};

// One dimension of an output's shape rule.
enum class DimKind { constant, input_dim, leading, attribute };
struct DimTerm {
    DimKind kind;
    int ref;       // input_dim / leading: the input's index; attribute: the attribute's index
    int axis;      // input_dim: the input's axis
    int64_t value; // constant
};

struct OutputSpec {
    const char* name;
    TypeClass type;     // when like_input < 0
    int like_input;     // >= 0: the element type of that input
    const DimTerm* shape;
    int n_terms;        // a `leading` term stands for all but the input's last dim
};

struct OpSpec {
    const char* name;
    const InputSpec* inputs;
    int n_inputs;
    const AttrSpec* attrs;
    int n_attrs;
    const OutputSpec* outputs;
    int n_outputs;

    size_t required_inputs() const;  // before the optional and variadic ones
    size_t optional_inputs() const;
    bool variadic() const { return n_inputs > 0 && inputs[n_inputs - 1].variadic; }
    int attr_index(const char* attr) const;  // -1 when the op has none such
};

// An attribute's value; only the field of its type is used.
struct AttrValue {
    float f = 0.f;
    int64_t i = 0;
    std::string s;
};
using AttrValues = std::vector<AttrValue>;  // in the table's attribute order

}  // namespace mla::ops

#include "op_table.gen.hpp"

namespace mla::ops {

const OpSpec& spec(OpId id);
const OpSpec* find_op(const std::string& name);  // nullptr: not an op of the table

// The defaults; a required attribute starts unset (NaN / INT64_MIN), which check_attrs refuses.
AttrValues default_attrs(const OpSpec& op);
// Every attribute against the table (required, allowed values, bounds, the kernels' checks):
// throws mla::Error "<op>: attribute '<name>' ..." naming the first bad one.
void check_attrs(const OpSpec& op, const AttrValues& values);
float attr_f(const OpSpec& op, const AttrValues& values, const char* name);
int64_t attr_i(const OpSpec& op, const AttrValues& values, const char* name);
const std::string& attr_s(const OpSpec& op, const AttrValues& values, const char* name);

// Input i's name in error messages; the variadic input's k-th tensor is "<name>.<k>".
const char* input_name(const OpSpec& op, size_t i);

// The table as compiled, as JSON (what mla_export.ops compares its own reading of table.json to).
const std::string& table_json();

}  // namespace mla::ops
