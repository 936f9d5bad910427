// A mixture-of-experts layer of a few tokens on the device, with no step read back by the
// host, so that a CUDA graph can record it:
//
//   moe_route_f32       each token's experts and weights from the router's f32 logits
//                       (moe/routing.rs's rules: softmax, or GLM-4.5's sigmoid scores
//                       chosen among the best groups by biased scores), best first;
//   moe_matvec_*        for every (token, slot) the product of its expert's matrix, found
//                       through a table of the experts' weight addresses, by the token's
//                       row (the gate/up product) or by the slot's own row (the down
//                       product);
//   moe_combine_f32     per token, the slots' outputs times their weights, added in
//                       ascending expert order (the order of the grouped path and the
//                       CPU's).
//
// The products read each chosen expert once per (token, slot), not once per expert: this
// path is for decode steps of a few rows, where tokens rarely share an expert.

#include "common.cuh"

namespace {

constexpr int MOE_MAX_EXPERTS = 1024;
constexpr int MOE_MAX_GROUPS = 64;
// Warps of a matvec block, one output row each at a time.
constexpr int MOE_MATVEC_WARPS = 8;

// (v, i) ranks above (bv, bi): a higher value, ties to the lower index.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// The warp's best (value, index); every lane gets it.
__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

// The best key of `key[0..n)` whose index passes `open`, across the warp (lane-strided).
template <typename Open>
__device__ __forceinline__ int warp_argmax(const float* key, int n, Open open) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = threadIdx.x; e < n; e += 32)
        if (open(e) && better(key[e], e, bv, bi)) {
            bv = key[e];
            bi = e;
        }
    warp_best(bv, bi);
    return bi;
}

}  // namespace

// One warp per token: `ids` and `weights` are [tokens, top_k], best first. Without `bias`
// (softmax): weight = softmax probability, divided by the chosen ones' sum if `norm`. With
// `bias` (sigmoid): each group of experts is worth its two best biased scores; among the
// `top_groups` best groups the `top_k` best biased scores are chosen; weight = the
// unbiased score (divided by the chosen ones' sum if `norm`) times `scale`.
extern "C" __global__ void __launch_bounds__(32)
    moe_route_f32(unsigned* __restrict__ ids, float* __restrict__ weights,
                  const float* __restrict__ logits, int experts, int top_k, int norm,
                  const float* __restrict__ bias, int groups, int top_groups, float scale) {
    __shared__ float score[MOE_MAX_EXPERTS];
    __shared__ float key[MOE_MAX_EXPERTS];
    __shared__ float worth[MOE_MAX_GROUPS];
    __shared__ int chosen_group[MOE_MAX_GROUPS];
    const int lane = threadIdx.x;
    const float* row = logits + (size_t)blockIdx.x * experts;
    unsigned* out_ids = ids + (size_t)blockIdx.x * top_k;
    float* out_w = weights + (size_t)blockIdx.x * top_k;
    float total = 0.f;
    int per = experts;
    if (!bias) {
        float m = -INFINITY;
        for (int e = lane; e < experts; e += 32) m = fmaxf(m, row[e]);
        m = warp_max(m);
        float s = 0.f;
        for (int e = lane; e < experts; e += 32) {
            const float p = expf(row[e] - m);
            score[e] = p;
            key[e] = p;
            s += p;
        }
        total = warp_sum(s);
    } else {
        for (int e = lane; e < experts; e += 32) {
            const float s = 1.f / (1.f + expf(-row[e]));
            score[e] = s;
            key[e] = s + bias[e];
        }
        __syncthreads();
        per = experts / groups;
        for (int g = lane; g < groups; g += 32) {
            float b1 = -INFINITY, b2 = -INFINITY;
            int i1 = 0x7fffffff;
            for (int e = g * per; e < (g + 1) * per; ++e) {
                if (better(key[e], e, b1, i1)) {
                    b2 = b1;
                    b1 = key[e];
                    i1 = e;
                } else if (key[e] > b2) {
                    b2 = key[e];
                }
            }
            worth[g] = per > 1 ? b1 + b2 : b1;
            chosen_group[g] = 0;
        }
        __syncthreads();
        for (int r = 0; r < top_groups; ++r) {
            const int g = warp_argmax(worth, groups, [&](int i) { return !chosen_group[i]; });
            __syncthreads();
            if (lane == 0) chosen_group[g] = 1;
            __syncthreads();
        }
    }
    __syncthreads();
    const int candidates = bias ? groups * per : experts;
    for (int j = 0; j < top_k; ++j) {
        const int e = warp_argmax(key, candidates, [&](int i) {
            return !bias || chosen_group[i / per];
        });
        __syncthreads();
        if (lane == 0) {
            out_ids[j] = (unsigned)e;
            out_w[j] = score[e];
            key[e] = -INFINITY;
        }
        __syncthreads();
    }
    if (lane != 0) return;
    if (!bias) {
        for (int j = 0; j < top_k; ++j) out_w[j] /= total;
        if (norm) {
            float chosen = 0.f;
            for (int j = 0; j < top_k; ++j) chosen += out_w[j];
            for (int j = 0; j < top_k; ++j) out_w[j] /= chosen;
        }
    } else {
        float chosen = 0.f;
        for (int j = 0; j < top_k; ++j) chosen += out_w[j];
        chosen += 1e-20f;
        for (int j = 0; j < top_k; ++j) out_w[j] = (norm ? out_w[j] / chosen : out_w[j]) * scale;
    }
}

namespace {

__device__ __forceinline__ bool aligned(const void* p, size_t bytes) {
    return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// `V` consecutive values at `p` as floats: one 16- or 8-byte load where they fill one.
template <int V, typename X>
__device__ __forceinline__ void load_floats(const X* __restrict__ p, float out[V]) {
    if constexpr (sizeof(X) * V == 16) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const X* v = reinterpret_cast<const X*>(&raw);
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = to_float(v[i]);
    } else if constexpr (sizeof(X) * V == 8) {
        const uint2 raw = *reinterpret_cast<const uint2*>(p);
        const X* v = reinterpret_cast<const X*>(&raw);
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = to_float(v[i]);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = to_float(p[i]);
    }
}

// out[s, r] = Σ_c W_e[r, c] · x[row, c] for slot s = (token t, choice j) of `ids`
// ([tokens, top_k]), e = ids[s], W_e the `rows x cols` matrix at `table[e]`, and row = s
// (`per_slot`) or t. One warp per output row, the weights read 16 bytes at a time (and
// the activations as many values at a time), where the rows are aligned to that.
template <typename W, typename X, typename O>
__device__ __forceinline__ void moe_matvec(O* __restrict__ out,
                                           const unsigned long long* __restrict__ table,
                                           const unsigned* __restrict__ ids,
                                           const X* __restrict__ x, int rows, int cols,
                                           int top_k, int per_slot) {
    const int s = blockIdx.y;
    const int lane = threadIdx.x % 32;
    const int r = blockIdx.x * MOE_MATVEC_WARPS + threadIdx.x / 32;
    if (r >= rows) return;
    const W* w = reinterpret_cast<const W*>(table[ids[s]]) + (size_t)r * cols;
    const X* xr = x + (size_t)(per_slot ? s : s / top_k) * cols;
    constexpr int V = 16 / sizeof(W);
    float acc = 0.f;
    if (cols % V == 0 && aligned(w, 16) && aligned(xr, V * sizeof(X))) {
#pragma unroll 4
        for (int c = lane * V; c < cols; c += 32 * V) {
            float wv[V], xv[V];
            load_floats<V>(w + c, wv);
            load_floats<V>(xr + c, xv);
#pragma unroll
            for (int i = 0; i < V; ++i) acc = fmaf(wv[i], xv[i], acc);
        }
    } else {
        for (int c = lane; c < cols; c += 32) acc = fmaf(to_float(w[c]), to_float(xr[c]), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[(size_t)s * rows + r] = from_float<O>(acc);
}

}  // namespace

#define TESSERA_MOE_MATVEC(NAME, W, X, O)                                                    \
    extern "C" __global__ void __launch_bounds__(32 * MOE_MATVEC_WARPS)                     \
        NAME(O* out, const unsigned long long* table, const unsigned* ids, const X* x,      \
             int rows, int cols, int top_k, int per_slot) {                                 \
        moe_matvec<W, X, O>(out, table, ids, x, rows, cols, top_k, per_slot);               \
    }

// Weights in bf16 or f16 on a GPU; f32 where the host emulates one.
TESSERA_MOE_MATVEC(moe_matvec_wbf16_xbf16_obf16, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16)
TESSERA_MOE_MATVEC(moe_matvec_wbf16_xbf16_of32, __nv_bfloat16, __nv_bfloat16, float)
TESSERA_MOE_MATVEC(moe_matvec_wf16_xf16_of16, __half, __half, __half)
TESSERA_MOE_MATVEC(moe_matvec_wf16_xf16_of32, __half, __half, float)
TESSERA_MOE_MATVEC(moe_matvec_wf32_xbf16_obf16, float, __nv_bfloat16, __nv_bfloat16)
TESSERA_MOE_MATVEC(moe_matvec_wf32_xbf16_of32, float, __nv_bfloat16, float)
TESSERA_MOE_MATVEC(moe_matvec_wf32_xf16_of16, float, __half, __half)
TESSERA_MOE_MATVEC(moe_matvec_wf32_xf16_of32, float, __half, float)

// out[t, c] = Σ_j weights[t, j] · y[t · top_k + j, c] over token t's slots in ascending
// expert order (f32). A grid-stride loop over `tokens x cols`.
extern "C" __global__ void moe_combine_f32(float* __restrict__ out, const float* __restrict__ y,
                                           const unsigned* __restrict__ ids,
                                           const float* __restrict__ weights, int tokens,
                                           int top_k, int cols) {
    const size_t total = (size_t)tokens * cols;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / cols, c = e % cols;
        const unsigned* tid = ids + t * top_k;
        float acc = 0.f;
        long long last = -1;
        for (int j = 0; j < top_k; ++j) {
            int slot = 0;
            unsigned long long next = ~0ull;
            for (int q = 0; q < top_k; ++q)
                if ((long long)tid[q] > last && tid[q] < next) {
                    next = tid[q];
                    slot = q;
                }
            acc += weights[t * top_k + slot] * y[(t * top_k + slot) * cols + c];
            last = (long long)next;
        }
        out[e] = acc;
    }
}
