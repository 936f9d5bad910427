// Causal attention that reads keys and values through block tables (paged KV cache).
//
// Cache layout (both K and V): [num_blocks, block_size, num_kv_heads, HD], so the row of
// one (slot, kv head) is HD contiguous values. A token at position `pos` of a sequence
// attends to the positions 0..=pos of that sequence, all of which are in the cache
// (the step's new keys and values are written before attention runs), so prefill,
// chunked prefill and decode take the same path. With a sliding window (`window` > 0) it
// attends to pos + 1 - window ..= pos only, and a tile reads no key before the window of
// its first token: its partitions start there. With `softcap` > 0 (Gemma 2) each scaled
// score s becomes softcap · tanh(s / softcap) before the softmax. With `sinks` (gpt-oss;
// null otherwise) each query head has one more logit that joins its softmax but attends
// to nothing: the values' weights then sum to less than one.
//
// One thread block serves one query head and one tile of up to QT consecutive tokens of
// one sequence. The context is walked in chunks of CHUNK keys, one key per thread:
//   1. each thread computes its key's score against every query of the tile;
//   2. one warp per query folds the chunk into that query's running max and sum
//      (online softmax) and turns the scores into weights;
//   3. each thread accumulates weight · value for the (query, dimension) outputs it owns.
// QT = 1 serves decoding tokens; its context may be split into partitions (grid z),
// whose partial results `attention_merge` combines. QT = 16 serves prefill chunks: each
// key is loaded once for 16 queries.
//
// The cache holds the activation type T, or an 8-bit type C with scales
// (kernels/src/kv_quant.rs): int8 with one scale per (block, KV head), `[num_blocks,
// num_kv_heads]`; fp8 E4M3 with one per KV head of the layer, `[num_kv_heads]`; K's and
// V's apart. A key's score is its raw dot product times its scale; a value's weight is
// multiplied by its scale.

#include "common.cuh"

namespace {

constexpr int NT = 128;     // threads per block
constexpr int CHUNK = NT;   // keys per chunk: one per thread
constexpr int NWARPS = NT / 32;

// A (token, head)'s output from its weighted values `a` and weights `l`, both relative to
// the largest score `m`; the head's sink logit, where there is one, joins the weights.
__device__ __forceinline__ float normalized(float a, float m, float l,
                                            const float* __restrict__ sinks, int head) {
    if (!(l > 0.f)) return 0.f;
    if (sinks == nullptr) return a / l;
    const float s = sinks[head];
    const float top = fmaxf(m, s);
    const float f = __expf(m - top);
    return a * f / (l * f + __expf(s - top));
}

// Where a cache element type keeps its scales: none (the activation types), one per
// (block, KV head) (int8), one per KV head (fp8).
template <typename C> struct ScaleOf { static constexpr int kind = 0; };
template <> struct ScaleOf<int8_t> { static constexpr int kind = 1; };
template <> struct ScaleOf<e4m3> { static constexpr int kind = 2; };

template <typename C>
__device__ __forceinline__ float scale_of(const float* __restrict__ scales, size_t block,
                                          int nkv, int kv_head) {
    if constexpr (ScaleOf<C>::kind == 1) return scales[block * nkv + kv_head];
    if constexpr (ScaleOf<C>::kind == 2) return scales[kv_head];
    return 1.f;
}

template <typename T, typename C, int HD, int QT>
__device__ __forceinline__ void attention_tile(
    T* __restrict__ out, int out_stride,
    float* __restrict__ part_ms, float* __restrict__ part_acc,
    const T* __restrict__ q, int q_stride,
    const C* __restrict__ k_cache, const C* __restrict__ v_cache,
    const float* __restrict__ k_scales, const float* __restrict__ v_scales,
    const uint32_t* __restrict__ positions,
    const uint32_t* __restrict__ tile_start, const uint32_t* __restrict__ tile_len,
    const uint32_t* __restrict__ seq_of_token,
    const uint32_t* __restrict__ block_tables, int max_blocks,
    const uint32_t* __restrict__ kv_of_q,
    int nq, int nkv, int block_size, float scale, int partition_size, int window,
    float softcap, const float* __restrict__ sinks) {
    static_assert(HD % 8 == 0, "head dim must be a multiple of 8");
    constexpr bool SCALED = ScaleOf<C>::kind != 0;
    const int head = blockIdx.x;
    const int tile = blockIdx.y;
    const int part = blockIdx.z;
    const int num_parts = gridDim.z;
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;

    const int t0 = tile_start[tile];
    const int nt = tile_len[tile];
    const int ctx = (int)positions[t0 + nt - 1] + 1;
    // The first key of the tile: the start of its first token's window.
    const int k_lo = window > 0 ? max(0, (int)positions[t0] + 1 - window) : 0;
    const int k_begin = k_lo + part * partition_size;
    const int k_end = min(ctx, k_begin + partition_size);

    __shared__ float qs[QT][HD];
    __shared__ float sc[QT][CHUNK];
    // The scale of each key's value in the chunk (8-bit caches).
    __shared__ float vsc[SCALED ? CHUNK : 1];
    __shared__ float m_s[QT];
    __shared__ float l_s[QT];
    __shared__ float r_s[QT];
    __shared__ int qpos[QT];
    __shared__ int qlo[QT];

    for (int e = tid; e < QT * HD; e += NT) {
        const int i = e / HD, d = e % HD;
        qs[i][d] = i < nt ? to_float(q[(size_t)(t0 + i) * q_stride + (size_t)head * HD + d]) * scale
                          : 0.f;
    }
    if (tid < QT) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.f;
        r_s[tid] = 0.f;
        qpos[tid] = tid < nt ? (int)positions[t0 + tid] : -1;
        qlo[tid] = tid < nt && window > 0 ? (int)positions[t0 + tid] + 1 - window : 0;
    }
    __syncthreads();

    constexpr int EPT = (QT * HD + NT - 1) / NT;  // outputs owned per thread
    float acc[EPT];
#pragma unroll
    for (int k = 0; k < EPT; ++k) acc[k] = 0.f;

    // Decode (QT == 1): G lanes per key, KPW keys per warp, KPB keys per block in flight.
    constexpr int G = HD / 8;
    constexpr int KPW = G <= 32 ? 32 / G : 1;
    constexpr int KPB = KPW * NWARPS;
    const int kk = lane / G, g8 = lane % G;
    float acc8[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) acc8[u] = 0.f;

    const uint32_t* table = block_tables + (size_t)seq_of_token[t0] * max_blocks;
    const size_t row_stride = (size_t)nkv * HD;
    const int kv_head = (int)kv_of_q[head];
    const size_t head_offset = (size_t)kv_head * HD;

    for (int c0 = k_begin; c0 < k_end; c0 += CHUNK) {
        const int n_keys = min(CHUNK, k_end - c0);
        // 1. Scores of this thread's key.
        {
            const int j = c0 + tid;
            float s[QT];
#pragma unroll
            for (int i = 0; i < QT; ++i) s[i] = 0.f;
            if (tid < n_keys) {
                const size_t block = table[j / block_size];
                const size_t slot = block * block_size + j % block_size;
                const C* krow = k_cache + slot * row_stride + head_offset;
#pragma unroll 4
                for (int d = 0; d < HD; d += 8) {
                    float kf[8];
                    load8(krow + d, kf);
#pragma unroll
                    for (int i = 0; i < QT; ++i) {
#pragma unroll
                        for (int u = 0; u < 8; ++u) s[i] = fmaf(qs[i][d + u], kf[u], s[i]);
                    }
                }
                if constexpr (SCALED) {
                    const float ks = scale_of<C>(k_scales, block, nkv, kv_head);
#pragma unroll
                    for (int i = 0; i < QT; ++i) s[i] *= ks;
                    vsc[tid] = scale_of<C>(v_scales, block, nkv, kv_head);
                }
            }
#pragma unroll
            for (int i = 0; i < QT; ++i) {
                const float capped = softcap > 0.f ? softcap * tanhf(s[i] / softcap) : s[i];
                sc[i][tid] = (tid < n_keys && j <= qpos[i] && j >= qlo[i]) ? capped : -INFINITY;
            }
        }
        __syncthreads();
        // 2. Online softmax, one warp per query.
        for (int i = warp; i < QT; i += NWARPS) {
            float mx = -INFINITY;
            for (int c = lane; c < CHUNK; c += 32) mx = fmaxf(mx, sc[i][c]);
            mx = warp_max(mx);
            const float m_old = m_s[i];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int c = lane; c < CHUNK; c += 32) {
                const float p = m_new == -INFINITY ? 0.f : __expf(sc[i][c] - m_new);
                sc[i][c] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float r = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
                r_s[i] = r;
                l_s[i] = l_s[i] * r + sum;
                m_s[i] = m_new;
            }
        }
        __syncthreads();
        // 3. Weighted values.
        if constexpr (QT == 1) {
            // Keys spread over warps and lanes, 8 dimensions per lane (one 16-byte load):
            // a decoding token's chunk is KPB keys at a time instead of one.
            if (kk < KPW) {
                const float r = r_s[0];
#pragma unroll
                for (int u = 0; u < 8; ++u) acc8[u] *= r;
                for (int c = warp * KPW + kk; c < n_keys; c += KPB) {
                    const int j = c0 + c;
                    const size_t slot = (size_t)table[j / block_size] * block_size + j % block_size;
                    float vf[8];
                    load8(v_cache + slot * row_stride + head_offset + g8 * 8, vf);
                    float p = sc[0][c];
                    if constexpr (SCALED) p *= vsc[c];
#pragma unroll
                    for (int u = 0; u < 8; ++u) acc8[u] = fmaf(p, vf[u], acc8[u]);
                }
            }
            __syncthreads();
            continue;
        }
#pragma unroll
        for (int k = 0; k < EPT; ++k) {
            const int e = tid + k * NT;
            if (e < QT * HD) {
                const int i = e / HD, d = e % HD;
                float a = acc[k] * r_s[i];
                for (int c = 0; c < n_keys; ++c) {
                    const int j = c0 + c;
                    const size_t slot = (size_t)table[j / block_size] * block_size + j % block_size;
                    float w = sc[i][c];
                    if constexpr (SCALED) w *= vsc[c];
                    a = fmaf(w, to_float(v_cache[slot * row_stride + head_offset + d]), a);
                }
                acc[k] = a;
            }
        }
        __syncthreads();
    }

    if constexpr (QT == 1) {
        // Sum the key groups' partial outputs per dimension.
        __shared__ float red[KPB][HD];
        if (kk < KPW) {
#pragma unroll
            for (int u = 0; u < 8; ++u) red[warp * KPW + kk][g8 * 8 + u] = acc8[u];
        }
        __syncthreads();
        for (int d = tid; d < HD; d += NT) {
            float a = 0.f;
#pragma unroll
            for (int k = 0; k < KPB; ++k) a += red[k][d];
            if (num_parts == 1) {
                out[(size_t)t0 * out_stride + (size_t)head * HD + d] =
                    from_float<T>(normalized(a, m_s[0], l_s[0], sinks, head));
            } else {
                const size_t base = ((size_t)tile * nq + head) * num_parts + part;
                part_acc[base * HD + d] = a;
                if (d == 0) {
                    part_ms[base * 2] = m_s[0];
                    part_ms[base * 2 + 1] = l_s[0];
                }
            }
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < EPT; ++k) {
        const int e = tid + k * NT;
        if (e >= QT * HD) continue;
        const int i = e / HD, d = e % HD;
        if (i >= nt) continue;
        if (num_parts == 1) {
            out[(size_t)(t0 + i) * out_stride + (size_t)head * HD + d] =
                from_float<T>(normalized(acc[k], m_s[i], l_s[i], sinks, head));
        } else {
            // Partitions are only launched with QT == 1: one token per tile.
            const size_t base = ((size_t)tile * nq + head) * num_parts + part;
            part_acc[base * HD + d] = acc[k];
            if (d == 0) {
                part_ms[base * 2] = m_s[i];
                part_ms[base * 2 + 1] = l_s[i];
            }
        }
    }
}

// Combines the partitions of each (token, head): every partition's weighted values are
// rescaled from its own maximum score to the largest, then divided by the total weight
// (the head's sink, where there is one, is a partition of weight and no values).
template <typename T, int HD>
__device__ __forceinline__ void merge_partitions(
    T* __restrict__ out, int out_stride,
    const float* __restrict__ part_ms, const float* __restrict__ part_acc,
    const uint32_t* __restrict__ tile_start, int nq, int num_parts,
    const float* __restrict__ sinks) {
    const int head = blockIdx.x;
    const int tile = blockIdx.y;
    const size_t base = ((size_t)tile * nq + head) * num_parts;
    float m = -INFINITY;
    for (int p = 0; p < num_parts; ++p)
        if (part_ms[(base + p) * 2 + 1] > 0.f) m = fmaxf(m, part_ms[(base + p) * 2]);
    const bool any = m > -INFINITY;
    if (sinks != nullptr && any) m = fmaxf(m, sinks[head]);
    float total = sinks != nullptr && any ? __expf(sinks[head] - m) : 0.f;
    for (int p = 0; p < num_parts; ++p) {
        const float l = part_ms[(base + p) * 2 + 1];
        if (l > 0.f) total += l * __expf(part_ms[(base + p) * 2] - m);
    }
    const int t = tile_start[tile];
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float a = 0.f;
        for (int p = 0; p < num_parts; ++p) {
            const float l = part_ms[(base + p) * 2 + 1];
            if (l > 0.f) a = fmaf(part_acc[(base + p) * HD + d], __expf(part_ms[(base + p) * 2] - m), a);
        }
        out[(size_t)t * out_stride + (size_t)head * HD + d] = from_float<T>(total > 0.f ? a / total : 0.f);
    }
}

}  // namespace

#define TESSERA_ATTENTION(NAME, T, HD, QT)                                                    \
    extern "C" __global__ void __launch_bounds__(NT) NAME(                                    \
        T* out, int out_stride, float* part_ms, float* part_acc, const T* q, int q_stride,    \
        const T* k_cache, const T* v_cache, const uint32_t* positions,                         \
        const uint32_t* tile_start, const uint32_t* tile_len, const uint32_t* seq_of_token,   \
        const uint32_t* block_tables, int max_blocks, const uint32_t* kv_of_q, int nq,        \
        int nkv, int block_size, float scale, int partition_size, int window,                 \
        float softcap, const float* sinks) {                                                  \
        attention_tile<T, T, HD, QT>(out, out_stride, part_ms, part_acc, q, q_stride,         \
                                     k_cache, v_cache, nullptr, nullptr, positions,           \
                                     tile_start, tile_len, seq_of_token, block_tables,        \
                                     max_blocks, kv_of_q, nq, nkv, block_size, scale,         \
                                     partition_size, window, softcap, sinks);                 \
    }

// Over an 8-bit cache of element type C, with its K and V scales after the cache.
#define TESSERA_ATTENTION_8BIT(NAME, T, C, HD, QT)                                            \
    extern "C" __global__ void __launch_bounds__(NT) NAME(                                    \
        T* out, int out_stride, float* part_ms, float* part_acc, const T* q, int q_stride,    \
        const C* k_cache, const C* v_cache, const float* k_scales, const float* v_scales,     \
        const uint32_t* positions, const uint32_t* tile_start, const uint32_t* tile_len,      \
        const uint32_t* seq_of_token, const uint32_t* block_tables, int max_blocks,           \
        const uint32_t* kv_of_q, int nq, int nkv, int block_size, float scale,                \
        int partition_size, int window, float softcap, const float* sinks) {                  \
        attention_tile<T, C, HD, QT>(out, out_stride, part_ms, part_acc, q, q_stride,         \
                                     k_cache, v_cache, k_scales, v_scales, positions,         \
                                     tile_start, tile_len, seq_of_token, block_tables,        \
                                     max_blocks, kv_of_q, nq, nkv, block_size, scale,         \
                                     partition_size, window, softcap, sinks);                 \
    }

#define TESSERA_MERGE(NAME, T, HD)                                                            \
    extern "C" __global__ void NAME(T* out, int out_stride, const float* part_ms,             \
                                    const float* part_acc, const uint32_t* tile_start,        \
                                    int nq, int num_parts, const float* sinks) {              \
        merge_partitions<T, HD>(out, out_stride, part_ms, part_acc, tile_start, nq,           \
                                num_parts, sinks);                                            \
    }

#define TESSERA_HEAD_DIM(HD)                                                                  \
    TESSERA_ATTENTION(paged_attention_bf16_hd##HD##_q1, __nv_bfloat16, HD, 1)                 \
    TESSERA_ATTENTION(paged_attention_bf16_hd##HD##_q16, __nv_bfloat16, HD, 16)               \
    TESSERA_ATTENTION(paged_attention_f16_hd##HD##_q1, __half, HD, 1)                         \
    TESSERA_ATTENTION(paged_attention_f16_hd##HD##_q16, __half, HD, 16)                       \
    TESSERA_MERGE(attention_merge_bf16_hd##HD, __nv_bfloat16, HD)                             \
    TESSERA_MERGE(attention_merge_f16_hd##HD, __half, HD)                                     \
    TESSERA_ATTENTION_8BIT(paged_attention_bf16_int8_hd##HD##_q1, __nv_bfloat16, int8_t, HD, 1) \
    TESSERA_ATTENTION_8BIT(paged_attention_bf16_int8_hd##HD##_q16, __nv_bfloat16, int8_t, HD, 16) \
    TESSERA_ATTENTION_8BIT(paged_attention_bf16_fp8_hd##HD##_q1, __nv_bfloat16, e4m3, HD, 1)  \
    TESSERA_ATTENTION_8BIT(paged_attention_bf16_fp8_hd##HD##_q16, __nv_bfloat16, e4m3, HD, 16) \
    TESSERA_ATTENTION_8BIT(paged_attention_f16_int8_hd##HD##_q1, __half, int8_t, HD, 1)       \
    TESSERA_ATTENTION_8BIT(paged_attention_f16_int8_hd##HD##_q16, __half, int8_t, HD, 16)     \
    TESSERA_ATTENTION_8BIT(paged_attention_f16_fp8_hd##HD##_q1, __half, e4m3, HD, 1)          \
    TESSERA_ATTENTION_8BIT(paged_attention_f16_fp8_hd##HD##_q16, __half, e4m3, HD, 16)

TESSERA_HEAD_DIM(64)
TESSERA_HEAD_DIM(80)
TESSERA_HEAD_DIM(96)
TESSERA_HEAD_DIM(128)
TESSERA_HEAD_DIM(256)
