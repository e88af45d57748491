// What one latent cache row is made of, as the instruction-set tables read it (the formats are
// registered in cache_formats.hpp, their validation is in cache_format.hpp; this header only
// names a row's geometry, so isa.hpp can take rows in their stored format without depending on
// the validation code).
#pragma once

#include <cstdint>

#include "cache_formats.hpp"

namespace mla {

// One row of W = rank + (W - rank) values. Float rows are W values of their type (rank = W).
// Quantised rows: `rank` one-byte codes in `groups` equal groups, then one f32 scale per group,
// then the W - rank k_pe values as bf16 (cache_formats.hpp).
struct RowFormat {
    KvDtype kind = KvDtype::f32;
    int64_t width = 0;   // W
    int64_t rank = 0;    // quantised columns; W for float rows
    int64_t groups = 1;  // scales per row (quantised rows)

    int64_t group_size() const { return rank / groups; }
    int64_t scale_offset() const { return rank; }                 // bytes from the row start
    int64_t kpe_offset() const { return rank + 4 * groups; }      // bytes from the row start
};

}  // namespace mla
