// Matrix-vector products over GGUF-quantized weights for decode: y[r, c] = x[r, :] · W[c, :]
// for 1 to 8 activation rows r, W one row of quantized blocks per output column c, as
// ggml lays them out (Q4_0, Q4_1, Q8_0: 32 weights a block; Q4_K, Q5_K, Q6_K: 256).
//
// Two launches (kernels/src/gpu/quant_matvec.rs names them and picks their grids):
//   1. quantize_q8_act_{f32,bf16}: every 32 consecutive activations of a row become one
//      `q8_act` (int8 values, their scale d = amax / 127, and s = d * sum(values)), as
//      llama.cpp's q8_1 does, so the products below are integer dot products (__dp4a).
//   2. quant_matvec_{type}_r{R}: one warp per output column, QMV_WARPS columns a block.
//      A lane takes one "unit" of 32 weights at a time (a block, or a 32-weight sub-block
//      of a super-block), decodes it once into eight ints of four int8 weights, and
//      multiplies it with the same 32 activations of each of the R rows: each weight is
//      read from memory once per launch whatever R is. Lanes stride through the row's
//      units, then the warp sums its lanes.
//
// What a unit contributes to row r, with q its integer weights, a the row's int8 values:
//   d_a * (scale_lo * dot(q[0..16], a[0..16]) + scale_hi * dot(q[16..32], a[16..32]))
//     + min * s_a
// scale_lo = scale_hi but for Q6_K (a scale per 16 weights); `min` is the affine term of
// Q4_1 (+m) and of Q4_K/Q5_K (-dmin * m); the signed types (Q4_0, Q6_K) subtract their
// offset from each byte before the dot product instead.

#include "common.cuh"

namespace {

constexpr int QMV_WARPS = 4;
constexpr int QMV_THREADS = QMV_WARPS * 32;

}  // namespace

// 32 activations as int8: x[i] ~= d * qs[i]; s = d * sum(qs). 40 bytes.
struct q8_act {
    float d;
    float s;
    int8_t qs[32];
};

namespace {

// The four bytes at `p + 4 * i` as an int, from a buffer only 2-byte aligned (blocks of
// 18, 34 and 210 bytes).
__device__ __forceinline__ int load_b2(const uint8_t* p, int i) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p) + 2 * i;
    return (int)((uint32_t)h[0] | ((uint32_t)h[1] << 16));
}

// The same from a 4-byte aligned buffer.
__device__ __forceinline__ int load_b4(const uint8_t* p, int i) {
    return reinterpret_cast<const int*>(p)[i];
}

__device__ __forceinline__ float f16_at(const uint8_t* p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}

// One decoded unit of 32 weights.
struct unit {
    int q[8];
    float scale_lo, scale_hi, min;
};

// The scale and min of sub-block j of a Q4_K/Q5_K super-block: six bits each, packed in
// 12 bytes (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

enum QType { Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K };

template <int T> struct layout;
template <> struct layout<Q4_0> { static constexpr int elems = 32, bytes = 18; };
template <> struct layout<Q4_1> { static constexpr int elems = 32, bytes = 20; };
template <> struct layout<Q8_0> { static constexpr int elems = 32, bytes = 34; };
template <> struct layout<Q4_K> { static constexpr int elems = 256, bytes = 144; };
template <> struct layout<Q5_K> { static constexpr int elems = 256, bytes = 176; };
template <> struct layout<Q6_K> { static constexpr int elems = 256, bytes = 210; };

// Unit `u` (32 weights) of the row of blocks at `row`.
template <int T>
__device__ __forceinline__ unit decode(const uint8_t* __restrict__ row, int u) {
    constexpr int per_block = layout<T>::elems / 32;
    const uint8_t* b = row + (size_t)(u / per_block) * layout<T>::bytes;
    const int j = u % per_block;
    unit x;
    x.min = 0.f;
    if constexpr (T == Q4_0 || T == Q4_1) {
        // Weight i < 16 is the low nibble of byte i, weight 16 + i its high nibble.
        const uint8_t* qs = b + (T == Q4_0 ? 2 : 4);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = T == Q4_0 ? load_b2(qs, i) : load_b4(qs, i);
            x.q[i] = v & 0x0f0f0f0f;
            x.q[i + 4] = (v >> 4) & 0x0f0f0f0f;
            if constexpr (T == Q4_0) {
                x.q[i] = __vsubss4(x.q[i], 0x08080808);
                x.q[i + 4] = __vsubss4(x.q[i + 4], 0x08080808);
            }
        }
        x.scale_lo = x.scale_hi = f16_at(b);
        if constexpr (T == Q4_1) x.min = f16_at(b + 2);
    } else if constexpr (T == Q8_0) {
#pragma unroll
        for (int i = 0; i < 8; ++i) x.q[i] = load_b2(b + 2, i);
        x.scale_lo = x.scale_hi = f16_at(b);
    } else if constexpr (T == Q4_K || T == Q5_K) {
        // Sub-block j: the low (j even) or high nibbles of qs[32 (j / 2) ..][0..32]; Q5_K's
        // fifth bit of weight l is bit j of qh[l].
        const uint8_t* qs = b + (T == Q4_K ? 16 : 48) + 32 * (j / 2);
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            x.q[i] = (load_b4(qs, i) >> shift) & 0x0f0f0f0f;
            if constexpr (T == Q5_K) x.q[i] |= ((load_b4(b + 16, i) >> j) & 0x01010101) << 4;
        }
        int sc, m;
        scale_min_k4(b + 4, j, sc, m);
        x.scale_lo = x.scale_hi = f16_at(b) * (float)sc;
        x.min = -(f16_at(b + 2) * (float)m);
    } else {
        // Q6_K: ql[128], qh[64], int8 scales[16], d. Sub-block j is quarter t = j % 4 of
        // half h = j / 4: low 4 bits from the low (t < 2) or high nibbles of
        // ql[64 h + 32 (t % 2) ..], the top 2 from bits 2t of qh[32 h ..]; a scale for each
        // 16 weights.
        const int h = j / 4, t = j % 4;
        const uint8_t* ql = b + 64 * h + 32 * (t % 2);
        const uint8_t* qh = b + 128 + 32 * h;
        const int nshift = 4 * (t / 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int lo = (load_b2(ql, i) >> nshift) & 0x0f0f0f0f;
            const int hi = ((load_b2(qh, i) >> (2 * t)) & 0x03030303) << 4;
            x.q[i] = __vsubss4(lo | hi, 0x20202020);
        }
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * t;
        const float d = f16_at(b + 208);
        x.scale_lo = d * (float)sc[0];
        x.scale_hi = d * (float)sc[1];
    }
    return x;
}

template <int T, int R>
__device__ __forceinline__ void matvec(const uint8_t* __restrict__ w,
                                       const q8_act* __restrict__ xq, float* __restrict__ y,
                                       int n, int k) {
    const int lane = threadIdx.x % 32;
    const int col = blockIdx.x * QMV_WARPS + threadIdx.x / 32;
    // The whole warp leaves together: no block-wide barrier follows.
    if (col >= n) return;
    const int units = k / 32;
    const uint8_t* row = w + (size_t)col * (size_t)(k / layout<T>::elems) * layout<T>::bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    for (int u = lane; u < units; u += 32) {
        const unit x = decode<T>(row, u);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const q8_act& a = xq[(size_t)r * units + u];
            int lo = 0, hi = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                lo = __dp4a(x.q[i], load_b4(reinterpret_cast<const uint8_t*>(a.qs), i), lo);
                hi = __dp4a(x.q[i + 4], load_b4(reinterpret_cast<const uint8_t*>(a.qs), i + 4),
                            hi);
            }
            acc[r] += a.d * (x.scale_lo * (float)lo + x.scale_hi * (float)hi) + x.min * a.s;
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) y[(size_t)r * n + col] = v;
    }
}

// Grid (ceil(k / 32 / QMV_WARPS), rows), QMV_THREADS threads: warp b of a block makes
// activation block blockIdx.x * QMV_WARPS + b of row blockIdx.y, one value a lane.
template <typename X>
__device__ __forceinline__ void quantize_act(const X* __restrict__ x, q8_act* __restrict__ out,
                                             int k) {
    const int lane = threadIdx.x % 32;
    const int blk = blockIdx.x * QMV_WARPS + threadIdx.x / 32;
    if (blk >= k / 32) return;
    const size_t i = (size_t)blockIdx.y * k + (size_t)blk * 32 + lane;
    const float v = to_float(x[i]);
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.f;
    const float q = amax == 0.f ? 0.f : roundf(v / d);
    // A sum of 32 integers below 128 in magnitude: exact in f32.
    const float sum = warp_sum(q);
    q8_act& a = out[(size_t)blockIdx.y * (k / 32) + blk];
    a.qs[lane] = (int8_t)q;
    if (lane == 0) {
        a.d = d;
        a.s = d * sum;
    }
}

}  // namespace

#define TESSERA_QUANTIZE_ACT(SUFFIX, X)                                                        \
    extern "C" __global__ void __launch_bounds__(QMV_THREADS)                                  \
        quantize_q8_act_##SUFFIX(const X* x, q8_act* out, int k) {                             \
        quantize_act<X>(x, out, k);                                                            \
    }
TESSERA_QUANTIZE_ACT(f32, float)
TESSERA_QUANTIZE_ACT(bf16, __nv_bfloat16)

#define TESSERA_QMV(NAME, T, R)                                                                \
    extern "C" __global__ void __launch_bounds__(QMV_THREADS) quant_matvec_##NAME##_r##R(     \
        const uint8_t* w, const q8_act* x, float* y, int n, int k) {                           \
        matvec<T, R>(w, x, y, n, k);                                                           \
    }
#define TESSERA_QMV_ROWS(NAME, T)                                                              \
    TESSERA_QMV(NAME, T, 1) TESSERA_QMV(NAME, T, 2) TESSERA_QMV(NAME, T, 3)                    \
    TESSERA_QMV(NAME, T, 4) TESSERA_QMV(NAME, T, 5) TESSERA_QMV(NAME, T, 6)                    \
    TESSERA_QMV(NAME, T, 7) TESSERA_QMV(NAME, T, 8)
TESSERA_QMV_ROWS(q4_0, Q4_0)
TESSERA_QMV_ROWS(q4_1, Q4_1)
TESSERA_QMV_ROWS(q8_0, Q8_0)
TESSERA_QMV_ROWS(q4_k, Q4_K)
TESSERA_QMV_ROWS(q5_k, Q5_K)
TESSERA_QMV_ROWS(q6_k, Q6_K)
