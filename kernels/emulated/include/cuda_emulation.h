// What Tessera's CUDA kernels (kernels/cuda/*.cu) use of CUDA, for compiling them as
// host C++ and running them on the CPU: every CUDA thread of a block is a fiber that runs
// until it waits at __syncthreads or a warp shuffle, a barrier opens when every thread of
// its block (or warp) that has not returned waits at it, blocks run one after another
// (so `__shared__` can be a function's static storage), and the 16-bit float types
// convert with CUDA's round-to-nearest-even.
//
// It exists so that the kernels' indexing, masking, tiling and reductions are tested on
// machines without a GPU. It is not a performance model. It is stricter than a GPU where
// that is cheap: a warp only exchanges values at a shuffle, never in lockstep, and a
// thread that returns leaves its block's barriers, as on sm_70 and later.
#pragma once

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct uint3 {
    unsigned x = 0, y = 0, z = 0;
};
using dim3 = uint3;

struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

namespace emu {
// Indices of the running CUDA thread and of its block; the launch's shape.
extern thread_local uint3 thread_idx;
extern thread_local uint3 block_idx;
extern uint3 block_dim;
extern uint3 grid_dim;

void sync_block();
// Publishes `bytes` of this thread's value and returns lane `lane ^ mask`'s (the
// caller's own when that lane is outside the block).
void shuffle_xor(const void* mine, void* theirs, std::size_t bytes, int mask);
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::sync_block(); }

template <typename T>
inline T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask) {
    T out;
    emu::shuffle_xor(&v, &out, sizeof(T), lane_mask);
    return out;
}

template <typename A, typename B>
inline auto min(A a, B b) {
    return a < b ? a : b;
}
template <typename A, typename B>
inline auto max(A a, B b) {
    return a < b ? b : a;
}

inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
using std::isfinite;

// The integer SIMD intrinsics of the quantized matrix-vector kernels, exact:
// __dp4a(a, b, c) = c + the sum of the four products of a's and b's signed bytes;
// __vsubss4(a, b) = each signed byte of a minus b's, saturated to [-128, 127].
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i)
        c += static_cast<int>(static_cast<std::int8_t>(a >> (8 * i))) *
             static_cast<int>(static_cast<std::int8_t>(b >> (8 * i)));
    return c;
}
inline int __vsubss4(int a, int b) {
    std::uint32_t r = 0;
    for (int i = 0; i < 4; ++i) {
        int v = static_cast<int>(static_cast<std::int8_t>(a >> (8 * i))) -
                static_cast<int>(static_cast<std::int8_t>(b >> (8 * i)));
        v = v < -128 ? -128 : (v > 127 ? 127 : v);
        r |= (static_cast<std::uint32_t>(v) & 0xffu) << (8 * i);
    }
    return static_cast<int>(r);
}

inline unsigned atomicAdd(unsigned* addr, unsigned v) {
    return std::atomic_ref<unsigned>(*addr).fetch_add(v);
}

inline unsigned long long atomicMax(unsigned long long* addr, unsigned long long v) {
    std::atomic_ref<unsigned long long> a(*addr);
    unsigned long long old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

// 16-bit floats as their bits, converted with round-to-nearest-even like
// __float2bfloat16_rn and __float2half_rn.
struct __nv_bfloat16 {
    std::uint16_t bits;
};
struct __half {
    std::uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
struct __half2 {
    __half x, y;
};

inline float __bfloat162float(__nv_bfloat16 h) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(h.bits) << 16);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if (std::isnan(f)) return {static_cast<std::uint16_t>((u >> 16) | 0x40)};
    const std::uint32_t rounded = u + 0x7fff + ((u >> 16) & 1);
    return {static_cast<std::uint16_t>(rounded >> 16)};
}
inline float __half2float(__half h) { return static_cast<float>(std::bit_cast<_Float16>(h.bits)); }
inline __half __ushort_as_half(unsigned short bits) { return {bits}; }
inline __half __float2half_rn(float f) {
    return {std::bit_cast<std::uint16_t>(static_cast<_Float16>(f))};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline __half2 __floats2half2_rn(float a, float b) {
    return {__float2half_rn(a), __float2half_rn(b)};
}
