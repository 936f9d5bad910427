// The gated activation of the MLP over its fused gate/up rows: `gate_up` is
// [rows, 2 · width] (gate first), `out` is [rows, width]: SiLU(gate) · up (llama, qwen)
// or GELU(gate) · up with GELU's tanh approximation (gemma). Computed in f32, stored in
// the input type. gpt-oss's experts clamp both halves first: with g = min(gate, limit),
// (clamp(up, -limit, limit) + 1) · g · sigmoid(alpha · g).

#include "common.cuh"

namespace {

struct Silu {
    __device__ __forceinline__ float operator()(float g) const { return g / (1.f + __expf(-g)); }
};

struct GeluTanh {
    __device__ __forceinline__ float operator()(float g) const {
        const float k = 0.7978845608028654f;  // sqrt(2 / pi)
        return 0.5f * g * (1.f + tanhf(k * (g + 0.044715f * g * g * g)));
    }
};

template <typename T, typename Act>
__device__ __forceinline__ void gated_mul(T* __restrict__ out, const T* __restrict__ gate_up,
                                          int width, size_t total) {
    const Act act;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / width, c = e % width;
        const float g = to_float(gate_up[r * 2 * width + c]);
        const float u = to_float(gate_up[r * 2 * width + width + c]);
        out[e] = from_float<T>(act(g) * u);
    }
}

}  // namespace

#define TESSERA_GATED(NAME, T, ACT)                                                          \
    extern "C" __global__ void NAME(T* out, const T* gate_up, int width, size_t total) {     \
        gated_mul<T, ACT>(out, gate_up, width, total);                                       \
    }

TESSERA_GATED(silu_mul_bf16, __nv_bfloat16, Silu)
TESSERA_GATED(silu_mul_f16, __half, Silu)
TESSERA_GATED(gelu_tanh_mul_bf16, __nv_bfloat16, GeluTanh)
TESSERA_GATED(gelu_tanh_mul_f16, __half, GeluTanh)

template <typename T>
__device__ __forceinline__ void clamped_swiglu(T* __restrict__ out, const T* __restrict__ gate_up,
                                               int width, size_t total, float alpha, float limit) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / width, c = e % width;
        const float g = fminf(to_float(gate_up[r * 2 * width + c]), limit);
        const float u = fminf(fmaxf(to_float(gate_up[r * 2 * width + width + c]), -limit), limit);
        out[e] = from_float<T>((u + 1.f) * g / (1.f + __expf(-alpha * g)));
    }
}

#define TESSERA_CLAMPED(NAME, T)                                                             \
    extern "C" __global__ void NAME(T* out, const T* gate_up, int width, size_t total,       \
                                    float alpha, float limit) {                              \
        clamped_swiglu<T>(out, gate_up, width, total, alpha, limit);                         \
    }

TESSERA_CLAMPED(clamped_swiglu_mul_bf16, __nv_bfloat16)
TESSERA_CLAMPED(clamped_swiglu_mul_f16, __half)
