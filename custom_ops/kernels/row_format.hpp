// What one latent cache row is made of, as the instruction-set tables read it (the layouts and
// their validation are in cache_format.hpp; this header only names them, so isa.hpp can take
// rows in their stored format without depending on the validation code).
#pragma once

#include <cstdint>

namespace mla {

enum class KvDtype { automatic, f32, bf16, f16, int8, fp8 };

inline bool quantised(KvDtype t) { return t == KvDtype::int8 || t == KvDtype::fp8; }

// One row of W = rank + (W - rank) values. f32/bf16/f16 rows are W values of that type
// (rank = W). int8/fp8 rows: `rank` codes in `groups` equal groups, then one f32 scale per
// group, then the W - rank k_pe values as bf16 (cache_format.hpp).
struct RowFormat {
    KvDtype kind = KvDtype::f32;
    int64_t width = 0;   // W
    int64_t rank = 0;    // quantised columns (int8/fp8); W otherwise
    int64_t groups = 1;  // scales per row (int8/fp8)

    int64_t group_size() const { return rank / groups; }
    int64_t scale_offset() const { return rank; }                 // bytes from the row start
    int64_t kpe_offset() const { return rank + 4 * groups; }      // bytes from the row start
};

}  // namespace mla
