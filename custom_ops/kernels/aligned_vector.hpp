// std::vector with 64-byte aligned storage, for buffers that AMX tiles and 512-bit vectors load
// and store by whole rows: with the default allocator a large buffer starts 16 bytes past a page
// (glibc's chunk header), so every 64-byte row straddles two cache lines and each row's load or
// store costs two. Measured in the int8 tile kernel (qmatmul_amx.cpp, the 102400 x 2048 lm_head's
// re-layout and tile products on 8 rows, one core, weights in L2): 12.4 -> 9.3 ms.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace mla {

constexpr std::size_t kLineBytes = 64;

template <class T>
struct LineAlignedAllocator {
    using value_type = T;
    LineAlignedAllocator() = default;
    template <class U>
    LineAlignedAllocator(const LineAlignedAllocator<U>&) {}
    T* allocate(std::size_t n) {
        return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kLineBytes)));
    }
    void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(kLineBytes)); }
    template <class U>
    bool operator==(const LineAlignedAllocator<U>&) const { return true; }
    template <class U>
    bool operator!=(const LineAlignedAllocator<U>&) const { return false; }
};

template <class T>
using LineVector = std::vector<T, LineAlignedAllocator<T>>;

}  // namespace mla
