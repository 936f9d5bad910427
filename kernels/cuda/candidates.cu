// The sampling candidates of f32 logit rows [rows, cols] at each row's temperature: the
// columns whose scaled logit is within ln(2^-25) of the row's best, as (column, logit)
// pairs, so the host draws from a few thousand values instead of copying the row. The
// host sampler leaves out exactly these tokens (added after the best token's 1.0 their
// probabilities cannot change an f32 sum), so a seed draws the same token either way.
//
// `max_keys` holds each row's arg-max key from `argmax_rows_f32` (argmax.cu): order of the
// largest value in the high half. The test is the host's, in the same f32 operations:
//   logit / t - max / t >= -17.33
// Pairs land in `ids` / `values` slot-major (slot s of row r at s · rows + r, so the host
// copies only the slots the fullest row used), in no particular order; `counts[r]` counts
// every qualifying column, also those past `cap` (then the host copies the row).
// A row whose temperature is not above 0 is skipped (a greedy row or a whole one of the
// same launch). `counts` must be zeroed before the launch. Grid and blocks as
// argmax_rows_f32.

#include "common.cuh"

namespace {

constexpr int CANDIDATE_THREADS = 256;

// The float whose order argmax.cu's key_of put in the key's high half.
__device__ __forceinline__ float value_of(unsigned long long key) {
    const unsigned ordered = (unsigned)(key >> 32);
    const unsigned bits = (ordered & 0x80000000u) ? (ordered & 0x7fffffffu) : ~ordered;
    return __uint_as_float(bits);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(CANDIDATE_THREADS)
    sampling_candidates_f32(unsigned* counts, unsigned* ids, float* values,
                            const unsigned long long* max_keys, const float* logits,
                            const float* temperatures, int cols, int per_block, int cap) {
    const size_t row = blockIdx.y;
    const float t = temperatures[row];
    if (!(t > 0.f)) return;
    const unsigned long long key = max_keys[row];
    const float best = value_of(key);
    // No finite best (every value NaN, or an infinity): the host takes the whole row.
    if (key == 0 || !isfinite(best)) return;
    const float m = best / t;
    const int begin = blockIdx.x * per_block;
    const int end = min(cols, begin + per_block);
    const float* r = logits + row * cols;
    for (int c = begin + threadIdx.x; c < end; c += CANDIDATE_THREADS) {
        const float v = r[c];
        if (isfinite(v) && v / t - m >= -17.33f) {
            const unsigned slot = atomicAdd(counts + row, 1u);
            if (slot < (unsigned)cap) {
                ids[(size_t)slot * gridDim.y + row] = (unsigned)c;
                values[(size_t)slot * gridDim.y + row] = v;
            }
        }
    }
}

// Σ exp(logit − best) over each block's columns of f32 logit rows [rows, cols], for the
// rows' log-sum-exp (log-probabilities reported from the candidates alone). Grid and
// blocks as argmax_rows_f32, whose keys give each row's best; block b of row r writes
// partials[r · gridDim.x + b], and the host adds a row's partials in block order, so the
// sum does not depend on scheduling. A row with no finite best gets NaN (the host then
// copies it whole); -inf logits add nothing, a NaN logit makes the sum NaN, as on the host.
extern "C" __global__ void __launch_bounds__(CANDIDATE_THREADS)
    row_exp_sums_f32(float* partials, const unsigned long long* max_keys, const float* logits,
                     int cols, int per_block) {
    const size_t row = blockIdx.y;
    const unsigned long long key = max_keys[row];
    const float best = value_of(key);
    float* out = partials + row * gridDim.x + blockIdx.x;
    if (key == 0 || !isfinite(best)) {
        if (threadIdx.x == 0) *out = __uint_as_float(0x7fc00000u);
        return;
    }
    const int begin = blockIdx.x * per_block;
    const int end = min(cols, begin + per_block);
    const float* r = logits + row * cols;
    float sum = 0.f;
    for (int c = begin + threadIdx.x; c < end; c += CANDIDATE_THREADS) sum += expf(r[c] - best);
    __shared__ float warps[CANDIDATE_THREADS / 32];
    sum = warp_sum(sum);
    if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.f;
        for (int i = 0; i < CANDIDATE_THREADS / 32; ++i) total += warps[i];
        *out = total;
    }
}
