#include "cache_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "numeric.hpp"
#include "validate.hpp"

namespace mla {

KvDtype kv_dtype_from_name(const char* op, const std::string& name) {
    if (name.empty() || name == "auto") return KvDtype::automatic;
    if (name == "f32") return KvDtype::f32;
    if (name == "bf16") return KvDtype::bf16;
    if (name == "f16") return KvDtype::f16;
    if (name == "int8") return KvDtype::int8;
    if (name == "fp8") return KvDtype::fp8;
    throw Error(std::string(op) + ": attribute 'kv_dtype' must be one of f32, bf16, f16, int8, fp8 (or empty), got '" +
                name + "'");
}

const char* kv_dtype_name(KvDtype t) {
    switch (t) {
        case KvDtype::f32: return "f32";
        case KvDtype::bf16: return "bf16";
        case KvDtype::f16: return "f16";
        case KvDtype::int8: return "int8";
        case KvDtype::fp8: return "fp8";
        default: return "auto";
    }
}

int64_t scale_groups(KvDtype t) {
    switch (t) {
        case KvDtype::int8: return 4;  // mla_export/kv_formats.py and contract.py: the same rule
        case KvDtype::fp8: return 1;
        default: return 0;
    }
}

int64_t row_bytes(KvDtype t, int64_t r, int64_t dr) {
    switch (t) {
        case KvDtype::f32: return 4 * (r + dr);
        case KvDtype::int8: case KvDtype::fp8: return r + 4 * scale_groups(t) + 2 * dr;
        default: return 2 * (r + dr);
    }
}

namespace {

DType elem_of(KvDtype t) {
    switch (t) {
        case KvDtype::f32: return DType::f32;
        case KvDtype::bf16: return DType::bf16;
        case KvDtype::f16: return DType::f16;
        default: return DType::u8;
    }
}

}  // namespace

CacheRows cache_rows(const char* op, const TensorView& c, KvDtype kind, int64_t rank, bool writable) {
    check_rank(op, c, 3);
    if (kind == KvDtype::automatic) {
        switch (c.dtype) {
            case DType::f32: kind = KvDtype::f32; break;
            case DType::f16: kind = KvDtype::f16; break;
            case DType::bf16: case DType::u8: kind = KvDtype::bf16; break;
            default:
                fail(op, c, std::string("must be f32, bf16, f16 or u8 bytes of bf16 rows, got ") + dtype_name(c.dtype));
        }
    }
    CacheRows out;
    out.kind = kind;
    out.elem = elem_of(kind);
    out.base = static_cast<char*>(c.data);
    out.logical = c;
    const std::string what = std::string("(kv_dtype ") + kv_dtype_name(kind) + ")";
    if (c.dtype != out.elem && c.dtype != DType::u8)
        fail(op, c, "must be " + std::string(dtype_name(out.elem)) + " or its u8 bytes " + what + ", got " +
                        dtype_name(c.dtype));
    if (c.dim(1) < 1) fail(op, c, "must have a block size of at least 1, got shape " + shape_str(c.shape));
    if (c.numel() > 0 && c.data == nullptr) fail(op, c, "has no data");
    if (!quantised(kind)) {
        int64_t w = c.dim(2);
        if (c.dtype == DType::u8 && out.elem != DType::u8) {
            const int64_t esz = dtype_size(out.elem);
            if (c.dim(2) % esz != 0)
                fail(op, c, "of bytes " + what + " must have a last dimension divisible by " + std::to_string(esz) +
                                ", got shape " + shape_str(c.shape));
            w = c.dim(2) / esz;
        }
        out.logical.dtype = out.elem;
        out.logical.shape[2] = w;
        out.width = w;
        out.rank = w;
        out.row_bytes = w * dtype_size(out.elem);
        out.format = RowFormat{kind, w, w, 1};
        check_cache(op, out.logical, writable);
        return out;
    }
    if (c.dtype != DType::u8)
        fail(op, c, "must be u8 bytes " + what + ", got " + dtype_name(c.dtype));
    if (rank < 1)
        throw Error(std::string(op) + ": the latent rank r must be positive to read an " + kv_dtype_name(kind) +
                    " cache, got " + std::to_string(rank));
    const int64_t groups = scale_groups(kind);
    if (rank % groups != 0)
        throw Error(std::string(op) + ": an " + kv_dtype_name(kind) + " cache quantises kv_c in " +
                    std::to_string(groups) + " equal groups, so the latent rank r must be a multiple of " +
                    std::to_string(groups) + ", got " + std::to_string(rank));
    // dr = 0: rows with no bf16 part (the indexer's key cache, whose D values are all quantised).
    const int64_t rest = c.dim(2) - rank - 4 * groups;  // 2 * dr
    if (rest < 0 || rest % 2 != 0)
        fail(op, c, "must hold rows of r + 4 * G + 2 * dr bytes " + what + " with r = " + std::to_string(rank) +
                        ", G = " + std::to_string(groups) + " and dr >= 0 (codes, G f32 scales, bf16 k_pe), got shape " +
                        shape_str(c.shape));
    out.width = rank + rest / 2;
    out.rank = rank;
    out.row_bytes = c.dim(2);
    out.logical.shape[2] = out.width;
    out.format = RowFormat{kind, out.width, rank, groups};
    return out;
}

void store_row(const CacheRows& c, const float* src, void* row) {
    auto* p = static_cast<char*>(row);
    if (!quantised(c.kind)) return from_f32(src, c.elem, row, c.width);
    const RowFormat& f = c.format;
    const int64_t gs = f.group_size();
    const float top = c.kind == KvDtype::int8 ? 127.f : 448.f;
    for (int64_t g = 0; g < f.groups; ++g) {
        const float* x = src + g * gs;
        float amax = 0.f;
        bool finite = true;
        for (int64_t i = 0; i < gs; ++i) {
            if (!std::isfinite(x[i])) finite = false;
            amax = std::max(amax, std::fabs(x[i]));
        }
        const float scale = finite ? amax / top : std::numeric_limits<float>::quiet_NaN();
        const bool zero = !finite || scale == 0.f;  // codes 0: the scale alone says what the group is
        if (c.kind == KvDtype::int8) {
            auto* q = reinterpret_cast<int8_t*>(p) + g * gs;
            for (int64_t i = 0; i < gs; ++i)
                q[i] = zero ? 0 : static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(x[i] / scale))));
        } else {
            auto* q = reinterpret_cast<uint8_t*>(p) + g * gs;
            for (int64_t i = 0; i < gs; ++i) q[i] = zero ? 0 : f32_to_e4m3(x[i] / scale);
        }
        std::memcpy(p + f.scale_offset() + 4 * g, &scale, 4);
    }
    from_f32(src + f.rank, DType::bf16, p + f.kpe_offset(), c.width - f.rank);
}

}  // namespace mla
