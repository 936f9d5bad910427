// The C entry point the Rust side calls: it looks a kernel of kernels/cuda up by the name
// the engine launches it by and runs it on the grid it is given. An unknown name returns
// -1, so a kernel the engine names but the sources lack fails the tests.

#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "cuda_emulation.h"
#include "grid.h"

using u32 = std::uint32_t;

#define DECLARE_ATTENTION(NAME, T)                                                          \
    extern "C" void NAME(T*, int, float*, float*, const T*, int, const T*, const T*,        \
                         const u32*, const u32*, const u32*, const u32*, const u32*, int,   \
                         const u32*, int, int, int, float, int, int, float, const float*);
#define DECLARE_MERGE(NAME, T)                                                              \
    extern "C" void NAME(T*, int, const float*, const float*, const u32*, int, int,         \
                         const float*);
#define DECLARE_ATTENTION_8BIT(NAME, T, C)                                                  \
    extern "C" void NAME(T*, int, float*, float*, const T*, int, const C*, const C*,        \
                         const float*, const float*, const u32*, const u32*, const u32*,    \
                         const u32*, const u32*, int, const u32*, int, int, int, float, int, \
                         int, float, const float*);
#define DECLARE_8BIT(HD, A, T)                                                              \
    DECLARE_ATTENTION_8BIT(paged_attention_##A##_int8_hd##HD##_q1, T, int8_t)               \
    DECLARE_ATTENTION_8BIT(paged_attention_##A##_int8_hd##HD##_q16, T, int8_t)              \
    DECLARE_ATTENTION_8BIT(paged_attention_##A##_fp8_hd##HD##_q1, T, e4m3)                  \
    DECLARE_ATTENTION_8BIT(paged_attention_##A##_fp8_hd##HD##_q16, T, e4m3)
#define DECLARE_HEAD_DIM(HD)                                                                \
    DECLARE_8BIT(HD, bf16, __nv_bfloat16)                                                   \
    DECLARE_8BIT(HD, f16, __half)                                                           \
    DECLARE_ATTENTION(paged_attention_bf16_hd##HD##_q1, __nv_bfloat16)                      \
    DECLARE_ATTENTION(paged_attention_bf16_hd##HD##_q16, __nv_bfloat16)                     \
    DECLARE_ATTENTION(paged_attention_f16_hd##HD##_q1, __half)                              \
    DECLARE_ATTENTION(paged_attention_f16_hd##HD##_q16, __half)                             \
    DECLARE_MERGE(attention_merge_bf16_hd##HD, __nv_bfloat16)                               \
    DECLARE_MERGE(attention_merge_f16_hd##HD, __half)
#define FOR_HEAD_DIMS(M) M(64) M(80) M(96) M(128) M(256)
FOR_HEAD_DIMS(DECLARE_HEAD_DIM)

extern "C" void rope_write_kv_bf16(__nv_bfloat16*, int, __nv_bfloat16*, __nv_bfloat16*,
                                   const u32*, const u32*, const float*, const float*, int,
                                   int, int, int, int);
extern "C" void rope_write_kv_f16(__half*, int, __half*, __half*, const u32*, const u32*,
                                  const float*, const float*, int, int, int, int, int);
#define DECLARE_KV_STORE(A, T)                                                              \
    extern "C" void kv_store_int8_##A(const T*, int, int8_t*, int8_t*, float*, float*,      \
                                      const u32*, int, int, int, int, int);                 \
    extern "C" void kv_fp8_scales_##A(const T*, int, float*, float*, int, int, int, int);   \
    extern "C" void kv_store_fp8_##A(const T*, int, e4m3*, e4m3*, const float*,             \
                                     const float*, const u32*, int, int, int);
DECLARE_KV_STORE(bf16, __nv_bfloat16)
DECLARE_KV_STORE(f16, __half)
extern "C" void silu_mul_bf16(__nv_bfloat16*, const __nv_bfloat16*, int, std::size_t);
extern "C" void silu_mul_f16(__half*, const __half*, int, std::size_t);
extern "C" void gelu_tanh_mul_bf16(__nv_bfloat16*, const __nv_bfloat16*, int, std::size_t);
extern "C" void gelu_tanh_mul_f16(__half*, const __half*, int, std::size_t);
extern "C" void clamped_swiglu_mul_bf16(__nv_bfloat16*, const __nv_bfloat16*, int, std::size_t,
                                        float, float);
extern "C" void clamped_swiglu_mul_f16(__half*, const __half*, int, std::size_t, float, float);
extern "C" void add_rms_norm_bf16(float*, __nv_bfloat16*, const float*, const float*,
                                  const float*, int, float);
extern "C" void add_rms_norm_f16(float*, __half*, const float*, const float*, const float*,
                                 int, float);
extern "C" void argmax_rows_f32(unsigned long long*, const float*, int, int);
extern "C" void sampling_candidates_f32(unsigned*, unsigned*, float*, const unsigned long long*,
                                        const float*, const float*, int, int, int);
extern "C" void row_exp_sums_f32(float*, const unsigned long long*, const float*, int, int);
struct q8_act;
extern "C" void quantize_q8_act_f32(const float*, q8_act*, int);
extern "C" void quantize_q8_act_bf16(const __nv_bfloat16*, q8_act*, int);
#define DECLARE_QMV(NAME, R) \
    extern "C" void quant_matvec_##NAME##_r##R(const uint8_t*, const q8_act*, float*, int, int);
#define FOR_QMV_ROWS(M, NAME) M(NAME, 1) M(NAME, 2) M(NAME, 3) M(NAME, 4) \
    M(NAME, 5) M(NAME, 6) M(NAME, 7) M(NAME, 8)
#define FOR_QMV(M) FOR_QMV_ROWS(M, q4_0) FOR_QMV_ROWS(M, q4_1) FOR_QMV_ROWS(M, q8_0) \
    FOR_QMV_ROWS(M, q4_k) FOR_QMV_ROWS(M, q5_k) FOR_QMV_ROWS(M, q6_k)
FOR_QMV(DECLARE_QMV)
extern "C" void moe_route_f32(unsigned*, float*, const float*, int, int, int, const float*, int,
                              int, float);
#define DECLARE_MOE_MATVEC(NAME, W, X, O)                                                   \
    extern "C" void NAME(O*, const unsigned long long*, const unsigned*, const X*, int, int,  \
                         int, int);
#define FOR_MOE_MATVEC(M)                                                                   \
    M(moe_matvec_wbf16_xbf16_obf16, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16)            \
    M(moe_matvec_wbf16_xbf16_of32, __nv_bfloat16, __nv_bfloat16, float)                     \
    M(moe_matvec_wf16_xf16_of16, __half, __half, __half)                                    \
    M(moe_matvec_wf16_xf16_of32, __half, __half, float)                                     \
    M(moe_matvec_wf32_xbf16_obf16, float, __nv_bfloat16, __nv_bfloat16)                     \
    M(moe_matvec_wf32_xbf16_of32, float, __nv_bfloat16, float)                              \
    M(moe_matvec_wf32_xf16_of16, float, __half, __half)                                     \
    M(moe_matvec_wf32_xf16_of32, float, __half, float)
FOR_MOE_MATVEC(DECLARE_MOE_MATVEC)
extern "C" void moe_combine_f32(float*, const float*, const unsigned*, const float*, int, int,
                                int);

extern "C" {

struct EmuGrid {
    unsigned grid[3];
    unsigned block[3];
};

}  // extern "C"

namespace {

uint3 dims(const unsigned d[3]) { return {d[0], d[1], d[2]}; }

bool is(const char* name, const char* want) { return std::strcmp(name, want) == 0; }

template <typename... A, std::size_t... I>
void call(void (*f)(A...), const EmuGrid& g, void** params, std::index_sequence<I...>) {
    std::tuple<A...> args{*static_cast<A*>(params[I])...};
    emu::run(dims(g.grid), dims(g.block), [&] { std::apply(f, args); });
}

template <typename... A>
int invoke(void (*f)(A...), const EmuGrid& g, void** params, const std::size_t* sizes,
           int count) {
    constexpr std::size_t want[] = {sizeof(A)...};
    if (count != static_cast<int>(sizeof...(A))) return -2;
    for (int i = 0; i < count; ++i)
        if (sizes[i] != want[i]) return -3;
    call(f, g, params, std::index_sequence_for<A...>{});
    return 0;
}

}  // namespace

// One entry for every kernel, as `cuLaunchKernel` takes them: `params[i]` points at the
// value of argument i, and `sizes[i]` is its size, checked against the kernel's own
// signature, so a launch with arguments missing, extra or of the wrong width is refused
// (-2: count, -3: a size) instead of reading garbage. -1: no kernel of that name.
extern "C" int tessera_emu_launch(const char* name, const EmuGrid* g, void** params,
                                  const std::size_t* sizes, int count) {
#define LAUNCH(F) \
    if (is(name, #F)) return invoke(F, *g, params, sizes, count);
#define LAUNCH_HEAD_DIM(HD)                       \
    LAUNCH(paged_attention_bf16_hd##HD##_q1)      \
    LAUNCH(paged_attention_bf16_hd##HD##_q16)     \
    LAUNCH(paged_attention_f16_hd##HD##_q1)       \
    LAUNCH(paged_attention_f16_hd##HD##_q16)      \
    LAUNCH(attention_merge_bf16_hd##HD)           \
    LAUNCH(attention_merge_f16_hd##HD)            \
    LAUNCH_8BIT(HD, bf16)                         \
    LAUNCH_8BIT(HD, f16)
#define LAUNCH_8BIT(HD, A)                        \
    LAUNCH(paged_attention_##A##_int8_hd##HD##_q1)  \
    LAUNCH(paged_attention_##A##_int8_hd##HD##_q16) \
    LAUNCH(paged_attention_##A##_fp8_hd##HD##_q1)   \
    LAUNCH(paged_attention_##A##_fp8_hd##HD##_q16)
    FOR_HEAD_DIMS(LAUNCH_HEAD_DIM)
    LAUNCH(kv_store_int8_bf16)
    LAUNCH(kv_store_int8_f16)
    LAUNCH(kv_fp8_scales_bf16)
    LAUNCH(kv_fp8_scales_f16)
    LAUNCH(kv_store_fp8_bf16)
    LAUNCH(kv_store_fp8_f16)
    LAUNCH(rope_write_kv_bf16)
    LAUNCH(rope_write_kv_f16)
    LAUNCH(silu_mul_bf16)
    LAUNCH(silu_mul_f16)
    LAUNCH(gelu_tanh_mul_bf16)
    LAUNCH(gelu_tanh_mul_f16)
    LAUNCH(clamped_swiglu_mul_bf16)
    LAUNCH(clamped_swiglu_mul_f16)
    LAUNCH(add_rms_norm_bf16)
    LAUNCH(add_rms_norm_f16)
    LAUNCH(argmax_rows_f32)
    LAUNCH(sampling_candidates_f32)
    LAUNCH(row_exp_sums_f32)
    LAUNCH(quantize_q8_act_f32)
    LAUNCH(quantize_q8_act_bf16)
#define LAUNCH_QMV(NAME, R) LAUNCH(quant_matvec_##NAME##_r##R)
    FOR_QMV(LAUNCH_QMV)
    LAUNCH(moe_route_f32)
#define LAUNCH_MOE_MATVEC(NAME, W, X, O) LAUNCH(NAME)
    FOR_MOE_MATVEC(LAUNCH_MOE_MATVEC)
    LAUNCH(moe_combine_f32)
    return -1;
}
