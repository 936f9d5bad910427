// Shared by Tessera's CUDA kernels: element conversions and warp/vector helpers.
// Kernels compute in f32 whatever the storage type (f16 or bf16; a KV cache may also
// hold int8 or fp8 E4M3, each with its scales, as `kernels/src/kv_quant.rs` defines).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// One byte of an fp8 KV cache: OCP FP8 E4M3, by its bits.
struct e4m3 {
    uint8_t bits;
};

// An int8 cache entry before its scale.
__device__ __forceinline__ float to_float(int8_t x) { return (float)x; }

// An E4M3 byte as f32, before its scale, as kv_quant.rs's `e4m3_to_f32` computes it:
// (mantissa with its implicit bit) * 2^(exponent - 10), subnormals taking exponent 1
// without the implicit bit; the NaN codes are never stored.
__device__ __forceinline__ float to_float(e4m3 x) {
    const unsigned b = x.bits;
    const int e = (b >> 3) & 0xf;
    const int m = (int)(b & 7u) | ((e != 0) << 3);
    const float v = (float)m * __uint_as_float((unsigned)(max(e, 1) - 10 + 127) << 23);
    return __uint_as_float(__float_as_uint(v) | ((b & 0x80u) << 24));
}

// `x` as E4M3 bits, rounded to nearest even, saturating at +-448 (NaN too): kv_quant.rs's
// `e4m3_from_f32`, bit for bit.
__device__ __forceinline__ e4m3 e4m3_of(float x) {
    const unsigned sign = (__float_as_uint(x) >> 24) & 0x80u;
    const float a = fabsf(x);
    // 464 is halfway between 448 and the NaN code's 480, and rounds to even: 448.
    if (!(a < 464.f)) return {(uint8_t)(sign | 0x7eu)};
    // Subnormal: whole units of 2^-9.
    if (a < 0.015625f) return {(uint8_t)(sign | (unsigned)rintf(a * 512.f))};
    const unsigned bits = __float_as_uint(a);
    const unsigned r = bits + 0x7ffffu + ((bits >> 20) & 1u);
    const int e = (int)(r >> 23) - 127 + 7;
    return {(uint8_t)(sign | ((unsigned)e << 3) | ((r >> 20) & 7u))};
}

// `x` stored as int8 under `scale`, rounded to nearest even and clamped to +-127; 0 when
// the scale is 0 (kv_quant.rs's `int8_quantize`).
__device__ __forceinline__ int8_t int8_of(float x, float scale) {
    if (!(scale > 0.f)) return 0;
    const float q = rintf(x / scale);
    if (q != q) return 0;
    return (int8_t)fminf(fmaxf(q, -127.f), 127.f);
}

// Eight consecutive cache or activation values as floats (before a cache's scale): one
// 16-byte load of 16-bit values, one 8-byte load of 8-bit ones. `p` must be aligned to
// that size: rows of the KV cache are, since every head dimension Tessera accepts is a
// multiple of 8.
template <typename T>
__device__ __forceinline__ void load8(const T* __restrict__ p, float out[8]) {
    static_assert(sizeof(T) == 2 || sizeof(T) == 1, "8- and 16-bit element types only");
    if constexpr (sizeof(T) == 2) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = to_float(v[i]);
    } else {
        const uint2 raw = *reinterpret_cast<const uint2*>(p);
        const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = to_float(v[i]);
    }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
