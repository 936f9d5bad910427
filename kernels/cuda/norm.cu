// The residual add and RMSNorm between a layer's halves, in one pass:
//   x_out = x + delta          (f32; delta may be null: x_out = x)
//   h     = x_out · w / sqrt(mean(x_out²) + eps), stored in T (the matmul input type)
// One thread block per row (up to 1024 threads, chosen by the host for the row width);
// the row's sum of squares is reduced in f32 across the block. A decode step normalizes a
// single row, so the kernel's time is the latency of its loads: each thread loads its
// values 16 bytes at a time, all up front, and keeps them in registers for the second
// pass instead of reading them back.

#include "common.cuh"

namespace {

constexpr int NORM_MAX_THREADS = 1024;
// float4s per thread held in registers between the passes (rows up to 16384 wide with
// 1024 threads); wider rows read the rest back from x_out.
constexpr int NORM_REGS = 4;

__device__ __forceinline__ bool aligned(const void* p, unsigned bytes) {
    return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Sum of `v` over the block; every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[NORM_MAX_THREADS / 32];
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.f;
    const int warps = (blockDim.x + 31) / 32;
    for (int i = 0; i < warps; ++i) total += partial[i];
    return total;
}

template <typename T>
__device__ __forceinline__ void store4(T* p, float a, float b, float c, float d);

template <>
__device__ __forceinline__ void store4<__nv_bfloat16>(__nv_bfloat16* p, float a, float b, float c,
                                                     float d) {
    __nv_bfloat162* q = reinterpret_cast<__nv_bfloat162*>(p);
    q[0] = __floats2bfloat162_rn(a, b);
    q[1] = __floats2bfloat162_rn(c, d);
}

template <>
__device__ __forceinline__ void store4<__half>(__half* p, float a, float b, float c, float d) {
    __half2* q = reinterpret_cast<__half2*>(p);
    q[0] = __floats2half2_rn(a, b);
    q[1] = __floats2half2_rn(c, d);
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

template <typename T>
__device__ __forceinline__ void add_rms_norm(float* __restrict__ x_out, T* __restrict__ h,
                                             const float* __restrict__ x,
                                             const float* __restrict__ delta,
                                             const float* __restrict__ w, int cols, float eps) {
    const size_t row = blockIdx.x;
    const int nt = blockDim.x;
    const float* xr = x + row * cols;
    const float* dr = delta ? delta + row * cols : nullptr;
    float* outr = x_out + row * cols;
    T* hr = h + row * cols;
    const bool vec = cols % 4 == 0 && aligned(xr, 16) && aligned(outr, 16) && aligned(w, 16) &&
                     aligned(hr, 8) && (!dr || aligned(dr, 16));
    float sq = 0.f;
    if (vec) {
        const int n4 = cols / 4;
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        const float4* d4 = reinterpret_cast<const float4*>(dr);
        const float4* w4 = reinterpret_cast<const float4*>(w);
        float4* o4 = reinterpret_cast<float4*>(outr);
        float4 v[NORM_REGS];
#pragma unroll
        for (int k = 0; k < NORM_REGS; ++k) {
            const int c = threadIdx.x + k * nt;
            if (c < n4) v[k] = d4 ? add4(x4[c], d4[c]) : x4[c];
        }
#pragma unroll
        for (int k = 0; k < NORM_REGS; ++k) {
            const int c = threadIdx.x + k * nt;
            if (c < n4) {
                o4[c] = v[k];
                sq = fmaf(v[k].x, v[k].x, sq);
                sq = fmaf(v[k].y, v[k].y, sq);
                sq = fmaf(v[k].z, v[k].z, sq);
                sq = fmaf(v[k].w, v[k].w, sq);
            }
        }
        for (int c = threadIdx.x + NORM_REGS * nt; c < n4; c += nt) {
            const float4 a = d4 ? add4(x4[c], d4[c]) : x4[c];
            o4[c] = a;
            sq = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, sq))));
        }
        const float inv = rsqrtf(block_sum(sq) / cols + eps);
#pragma unroll
        for (int k = 0; k < NORM_REGS; ++k) {
            const int c = threadIdx.x + k * nt;
            if (c < n4) {
                const float4 g = w4[c];
                store4<T>(hr + 4 * c, v[k].x * inv * g.x, v[k].y * inv * g.y, v[k].z * inv * g.z,
                          v[k].w * inv * g.w);
            }
        }
        // Each thread reads back only the values it wrote itself.
        for (int c = threadIdx.x + NORM_REGS * nt; c < n4; c += nt) {
            const float4 a = o4[c], g = w4[c];
            store4<T>(hr + 4 * c, a.x * inv * g.x, a.y * inv * g.y, a.z * inv * g.z,
                      a.w * inv * g.w);
        }
        return;
    }
    for (int c = threadIdx.x; c < cols; c += nt) {
        const float v = dr ? xr[c] + dr[c] : xr[c];
        outr[c] = v;
        sq = fmaf(v, v, sq);
    }
    const float inv = rsqrtf(block_sum(sq) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += nt) hr[c] = from_float<T>(outr[c] * inv * w[c]);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NORM_MAX_THREADS)
    add_rms_norm_bf16(float* x_out, __nv_bfloat16* h, const float* x, const float* delta,
                      const float* w, int cols, float eps) {
    add_rms_norm(x_out, h, x, delta, w, cols, eps);
}

extern "C" __global__ void __launch_bounds__(NORM_MAX_THREADS)
    add_rms_norm_f16(float* x_out, __half* h, const float* x, const float* delta, const float* w,
                     int cols, float eps) {
    add_rms_norm(x_out, h, x, delta, w, cols, eps);
}
