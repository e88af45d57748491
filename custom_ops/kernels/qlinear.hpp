// MlaQLinear: y = x @ W^T on integer weights, W [N, K] stored as qgemm.hpp's codes (int8 or
// packed int4, 4-row interleaved) with an f32 scale and a u8 zero point per group of inputs.
//
// It serves the projections whose weight reads dominate a decode step and that the CPU plugin's
// compressed matmul streams below memory speed (lm_head: 102400 rows, read every step for a few
// rows of x). Under the reduced-precision mode on AVX2/VNNI CPUs: dot products on the codes with int8
// activations for any number of rows; in f32, one pass over the codes for few rows and panels
// dequantised once and shared for many (moe_experts.hpp's tile routine, qmatmul.hpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mla_tensor.hpp"
#include "compute.hpp"

namespace mla {

struct QLinearInputs {
    TensorView x;                 // [..., K] f32 / bf16 / f16
    TensorView w_q, w_s, w_zp;    // [N, K / per_byte] u8, [N, G] f32, [N, G] u8
    bool zero_points_checked = false;  // int4 zero points already known to be <= 15 (qmatmul.hpp)
    bool tile16 = false;  // int8 or fp8 codes in qmatmul.hpp's tile16 layout instead of the 4-row one
};

// An op's `layout` attribute (MlaQLinear's, MlaMoeExperts'): "rows4" (the exported layout, the
// default) or "tile16" (the formats whose weight_format.hpp entry says so); anything else is an
// error naming op and the attribute.
bool layout_is_tile16(const char* op, const std::string& layout);
// Throws, naming the attributes and the formats that may lie in tiles, when tile16 is asked for
// codes of another format (op: the message's op name; bits_attr: the attribute holding bits). The
// op table's attribute check and the ops themselves ask it.
void check_qlinear_layout(const char* op, bool tile16, int64_t bits, const char* bits_attr = "bits");

// Checks every input and the bits attribute (4 or 8), naming the bad one; returns the output
// shape (x's leading dims, N).
std::vector<int64_t> qlinear_shape(const QLinearInputs& in, int64_t bits);

// The op's int4 zero-point inputs as (input index, name) (as int4_zero_point_inputs(MoeBits)).
std::vector<std::pair<size_t, const char*>> int4_zero_point_inputs(int64_t bits);

void qlinear(const QLinearInputs& in, int64_t bits, const TensorView& out, const Threading& threading,
             Compute compute = Compute::f32);

}  // namespace mla
