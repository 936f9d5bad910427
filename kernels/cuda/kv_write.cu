// Rotary position embedding of the step's queries and keys, and the write of the new
// keys and values into the paged KV cache, in one pass over the fused QKV rows.
//
// `qkv` holds one row per token: [q heads | k heads | v heads], each head `hd` wide. The
// queries are rotated in place (attention reads them from there); rotated keys and the
// values go to the token's cache slot, laid out [slot, kv head, hd] as attention.cu
// reads them. cos/sin: f32 tables [max_positions, hd / 2]. Rotation pairs are
// (2i, 2i + 1) when `interleaved`, else (i, i + rh) for the `rh` = `rotary_half` pairs of
// the rotated part of a head (all of it but for partial rotary, where rh < hd / 2), as in
// the CPU engine. The tables hold cos 1 and sin 0 for pairs i >= rh, so the dimensions
// past the rotated part, paired among themselves, are copied unchanged.
//
// An 8-bit cache (int8 or fp8 E4M3, see kernels/src/kv_quant.rs) is written in a second
// pass: `rope_write_kv_*` with null cache pointers rotates the keys in place in `qkv`,
// then `kv_store_*` below quantizes keys and values from there into the cache.

#include "common.cuh"

namespace {

template <typename T>
__device__ __forceinline__ void rope_write(
    T* __restrict__ qkv, int qkv_stride, T* __restrict__ k_cache, T* __restrict__ v_cache,
    const uint32_t* __restrict__ positions, const uint32_t* __restrict__ slots,
    const float* __restrict__ cos_table, const float* __restrict__ sin_table,
    int nq, int nkv, int hd, int interleaved, int rotary_half) {
    // Grid (tokens, items / blockDim): thread e of a token rotates the e-th (head, pair)
    // of its queries and keys and copies its e-th value element, so a decode step's
    // single token is spread over many blocks instead of looping in one.
    const int t = blockIdx.x;
    const int e = blockIdx.y * blockDim.x + threadIdx.x;
    const int half = hd / 2;
    const size_t pos = positions[t];
    const size_t slot = slots[t];
    T* row = qkv + (size_t)t * qkv_stride;
    if (e < (nq + nkv) * half) {
        const int h = e / half, i = e % half;
        const int rh = rotary_half;
        const int ia = interleaved ? 2 * i : (i < rh ? i : i + rh);
        const int ib = interleaved ? 2 * i + 1 : (i < rh ? i + rh : i + half);
        T* x = row + (size_t)h * hd;
        const float c = cos_table[pos * half + i], s = sin_table[pos * half + i];
        const float a = to_float(x[ia]), b = to_float(x[ib]);
        const float ra = a * c - b * s;
        const float rb = a * s + b * c;
        // Without a cache (an 8-bit one, stored by a later pass) keys rotate in place.
        T* dst = h < nq || k_cache == nullptr ? x : k_cache + (slot * nkv + (size_t)(h - nq)) * hd;
        dst[ia] = from_float<T>(ra);
        dst[ib] = from_float<T>(rb);
    }
    if (v_cache != nullptr && e < nkv * hd)
        v_cache[slot * nkv * hd + e] = row[(size_t)(nq + nkv) * hd + e];
}

constexpr int STORE_THREADS = 128;

// The largest of every thread's `m` in a block of STORE_THREADS threads, to all of them.
__device__ __forceinline__ float block_max(float m) {
    __shared__ float warps[STORE_THREADS / 32];
    __shared__ float result;
    m = warp_max(m);
    if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        float r = 0.f;
        for (int w = 0; w < STORE_THREADS / 32; ++w) r = fmaxf(r, warps[w]);
        result = r;
    }
    __syncthreads();
    const float r = result;
    __syncthreads();
    return r;
}

// int8 store. Grid (tokens, KV heads, 2: K then V), STORE_THREADS threads. A run is the
// step's consecutive tokens of one sequence that land in one block; the thread block of
// a run's first token stores the whole run for its head: the block's scale grows to hold
// the run's largest value (a run from position 0 starts the block anew), the block's
// earlier entries are requantized when it grew, then the run is quantized
// (kv_quant.rs's `Int8Run`, as the CPU ranks' write does it). Rows of the cache:
// [block, position, KV head, hd]; scales [block, KV head].
template <typename T>
__device__ __forceinline__ void store_int8(
    const T* __restrict__ qkv, int qkv_stride, int8_t* __restrict__ k_cache,
    int8_t* __restrict__ v_cache, float* __restrict__ k_scales, float* __restrict__ v_scales,
    const uint32_t* __restrict__ slots, int n, int nq, int nkv, int hd, int block_size) {
    const int t = blockIdx.x, h = blockIdx.y, is_v = blockIdx.z;
    const uint32_t slot = slots[t];
    const int bs = block_size;
    const int start = (int)(slot % bs);
    // Not a run's first token: that token's thread block stores it.
    if (t > 0 && start != 0 && slots[t - 1] + 1 == slot) return;
    int len = 1;
    while (t + len < n && start + len < bs && slots[t + len] == slot + (uint32_t)len) ++len;
    const T* src = qkv + (size_t)t * qkv_stride + (size_t)(nq + is_v * nkv + h) * hd;
    int8_t* cache = is_v ? v_cache : k_cache;
    float* scales = is_v ? v_scales : k_scales;
    const size_t block = slot / bs;
    const size_t idx = block * nkv + h;
    float m = 0.f;
    for (int e = threadIdx.x; e < len * hd; e += STORE_THREADS)
        m = fmaxf(m, fabsf(to_float(src[(size_t)(e / hd) * qkv_stride + e % hd])));
    const float amax = block_max(m);
    const float old = scales[idx];
    const float scale = fmaxf(start == 0 ? 0.f : old, amax / 127.f);
    // Entry d of position i of this (block, head).
    auto at = [&](int i, int d) { return ((block * bs + i) * nkv + h) * hd + d; };
    if (start > 0 && scale > old) {
        for (int e = threadIdx.x; e < start * hd; e += STORE_THREADS) {
            const size_t a = at(e / hd, e % hd);
            cache[a] = int8_of((float)cache[a] * old, scale);
        }
    }
    for (int e = threadIdx.x; e < len * hd; e += STORE_THREADS)
        cache[at(start + e / hd, e % hd)] =
            int8_of(to_float(src[(size_t)(e / hd) * qkv_stride + e % hd]), scale);
    // Every thread has read the old scale.
    __syncthreads();
    if (threadIdx.x == 0) scales[idx] = scale;
}

// fp8 scales of a layer's first write: grid (KV heads, 2: K then V), STORE_THREADS
// threads. A head whose scale is still 0 takes kv_quant.rs's `fp8_scale` of its largest
// value over the step's tokens; later writes keep it.
template <typename T>
__device__ __forceinline__ void fp8_scales(const T* __restrict__ qkv, int qkv_stride,
                                           float* __restrict__ k_scales,
                                           float* __restrict__ v_scales, int n, int nq,
                                           int nkv, int hd) {
    const int h = blockIdx.x, is_v = blockIdx.y;
    float* scale = (is_v ? v_scales : k_scales) + h;
    if (*scale > 0.f) return;
    const T* src = qkv + (size_t)(nq + is_v * nkv + h) * hd;
    float m = 0.f;
    for (size_t e = threadIdx.x; e < (size_t)n * hd; e += STORE_THREADS)
        m = fmaxf(m, fabsf(to_float(src[(e / hd) * qkv_stride + e % hd])));
    const float amax = block_max(m);
    if (threadIdx.x == 0) *scale = fmaxf(amax * 8.f / 448.f, 1e-12f);
}

// fp8 store: grid (tokens, 2 * KV heads * hd / STORE_THREADS), one value per thread,
// divided by its head's scale (one per layer and KV head, for K and for V).
template <typename T>
__device__ __forceinline__ void store_fp8(const T* __restrict__ qkv, int qkv_stride,
                                          e4m3* __restrict__ k_cache,
                                          e4m3* __restrict__ v_cache,
                                          const float* __restrict__ k_scales,
                                          const float* __restrict__ v_scales,
                                          const uint32_t* __restrict__ slots, int nq, int nkv,
                                          int hd) {
    const int t = blockIdx.x;
    const int e = blockIdx.y * STORE_THREADS + threadIdx.x;
    const int row = nkv * hd;
    if (e >= 2 * row) return;
    const int is_v = e / row, r = e % row;
    const float x = to_float(qkv[(size_t)t * qkv_stride + (size_t)nq * hd + e]);
    const float scale = (is_v ? v_scales : k_scales)[r / hd];
    (is_v ? v_cache : k_cache)[(size_t)slots[t] * row + r] = e4m3_of(x / scale);
}

}  // namespace

#define TESSERA_ROPE_WRITE(NAME, T)                                                           \
    extern "C" __global__ void NAME(T* qkv, int qkv_stride, T* k_cache, T* v_cache,          \
                                    const uint32_t* positions, const uint32_t* slots,         \
                                    const float* cos_table, const float* sin_table, int nq,   \
                                    int nkv, int hd, int interleaved, int rotary_half) {      \
        rope_write<T>(qkv, qkv_stride, k_cache, v_cache, positions, slots, cos_table,         \
                      sin_table, nq, nkv, hd, interleaved, rotary_half);                      \
    }

#define TESSERA_KV_STORE(SUFFIX, T)                                                           \
    extern "C" __global__ void __launch_bounds__(STORE_THREADS) kv_store_int8_##SUFFIX(       \
        const T* qkv, int qkv_stride, int8_t* k_cache, int8_t* v_cache, float* k_scales,      \
        float* v_scales, const uint32_t* slots, int n, int nq, int nkv, int hd,              \
        int block_size) {                                                                      \
        store_int8<T>(qkv, qkv_stride, k_cache, v_cache, k_scales, v_scales, slots, n, nq,    \
                      nkv, hd, block_size);                                                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(STORE_THREADS) kv_fp8_scales_##SUFFIX(      \
        const T* qkv, int qkv_stride, float* k_scales, float* v_scales, int n, int nq,        \
        int nkv, int hd) {                                                                     \
        fp8_scales<T>(qkv, qkv_stride, k_scales, v_scales, n, nq, nkv, hd);                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(STORE_THREADS) kv_store_fp8_##SUFFIX(       \
        const T* qkv, int qkv_stride, e4m3* k_cache, e4m3* v_cache, const float* k_scales,    \
        const float* v_scales, const uint32_t* slots, int nq, int nkv, int hd) {              \
        store_fp8<T>(qkv, qkv_stride, k_cache, v_cache, k_scales, v_scales, slots, nq, nkv,   \
                     hd);                                                                      \
    }

TESSERA_ROPE_WRITE(rope_write_kv_bf16, __nv_bfloat16)
TESSERA_ROPE_WRITE(rope_write_kv_f16, __half)
TESSERA_KV_STORE(bf16, __nv_bfloat16)
TESSERA_KV_STORE(f16, __half)
