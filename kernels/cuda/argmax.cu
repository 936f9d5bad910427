// Arg-max of each row of f32 logits [rows, cols], the lowest index winning ties as in the
// host sampler. A row is split across many thread blocks (one block scanning a 128k
// vocabulary alone takes ~100 µs; a GPU-wide scan takes a few). Each block folds its best
// (value, index) into the row's 64-bit key with one atomicMax:
//   key = order(value) << 32 | ~index
// where order() maps floats to unsigned integers of the same order (NaN lowest), so the
// largest key is the largest value and, among equal values, the lowest index. `keys`
// must be zeroed before the launch.

#include "common.cuh"

namespace {

constexpr int ARGMAX_THREADS = 256;

__device__ __forceinline__ unsigned long long key_of(float v, unsigned idx) {
    const unsigned b = __float_as_uint(v);
    const unsigned ordered = v != v ? 0u : (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)ordered << 32) | (unsigned long long)(~idx);
}

__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, o);
        v = other > v ? other : v;
    }
    return v;
}

}  // namespace

// Grid (blocks per row, rows); each block scans `per_block` consecutive columns.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_rows_f32(unsigned long long* keys, const float* logits, int cols, int per_block) {
    const size_t row = blockIdx.y;
    const int begin = blockIdx.x * per_block;
    const int end = min(cols, begin + per_block);
    const float* r = logits + row * cols;
    unsigned long long best = 0;
    for (int c = begin + threadIdx.x; c < end; c += ARGMAX_THREADS) {
        const unsigned long long k = key_of(r[c], (unsigned)c);
        best = k > best ? k : best;
    }
    __shared__ unsigned long long partial[ARGMAX_THREADS / 32];
    best = warp_max_u64(best);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < ARGMAX_THREADS / 32; ++i) best = partial[i] > best ? partial[i] : best;
        if (best != 0) atomicMax(keys + row, best);
    }
}
