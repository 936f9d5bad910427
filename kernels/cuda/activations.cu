// SiLU(gate) · up over the fused gate/up rows of the MLP: `gate_up` is [rows, 2 · width]
// (gate first), `out` is [rows, width]. Computed in f32, stored in the input type.

#include "common.cuh"

namespace {

template <typename T>
__device__ __forceinline__ void silu_mul(T* __restrict__ out, const T* __restrict__ gate_up,
                                         int width, size_t total) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / width, c = e % width;
        const float g = to_float(gate_up[r * 2 * width + c]);
        const float u = to_float(gate_up[r * 2 * width + width + c]);
        out[e] = from_float<T>(g / (1.f + __expf(-g)) * u);
    }
}

}  // namespace

extern "C" __global__ void silu_mul_bf16(__nv_bfloat16* out, const __nv_bfloat16* gate_up,
                                         int width, size_t total) {
    silu_mul(out, gate_up, width, total);
}

extern "C" __global__ void silu_mul_f16(__half* out, const __half* gate_up, int width,
                                        size_t total) {
    silu_mul(out, gate_up, width, total);
}
