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
        T* dst = h < nq ? x : k_cache + (slot * nkv + (size_t)(h - nq)) * hd;
        dst[ia] = from_float<T>(ra);
        dst[ib] = from_float<T>(rb);
    }
    if (e < nkv * hd) v_cache[slot * nkv * hd + e] = row[(size_t)(nq + nkv) * hd + e];
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

TESSERA_ROPE_WRITE(rope_write_kv_bf16, __nv_bfloat16)
TESSERA_ROPE_WRITE(rope_write_kv_f16, __half)
