// The C entry points the Rust side calls: each looks a kernel of kernels/cuda up by the
// name the engine launches it by and runs it on the grid it is given. An unknown name
// returns -1, so a kernel the engine names but the sources lack fails the tests.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_emulation.h"
#include "grid.h"

using u32 = std::uint32_t;

#define DECLARE_ATTENTION(NAME, T)                                                          \
    extern "C" void NAME(T*, int, float*, float*, const T*, int, const T*, const T*,        \
                         const u32*, const u32*, const u32*, const u32*, const u32*, int,   \
                         const u32*, int, int, int, float, int, int);
#define DECLARE_MERGE(NAME, T)                                                              \
    extern "C" void NAME(T*, int, const float*, const float*, const u32*, int, int);
#define DECLARE_HEAD_DIM(HD)                                                                \
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
                                   int, int, int);
extern "C" void rope_write_kv_f16(__half*, int, __half*, __half*, const u32*, const u32*,
                                  const float*, const float*, int, int, int, int);
extern "C" void silu_mul_bf16(__nv_bfloat16*, const __nv_bfloat16*, int, std::size_t);
extern "C" void silu_mul_f16(__half*, const __half*, int, std::size_t);
extern "C" void gelu_tanh_mul_bf16(__nv_bfloat16*, const __nv_bfloat16*, int, std::size_t);
extern "C" void gelu_tanh_mul_f16(__half*, const __half*, int, std::size_t);
extern "C" void add_rms_norm_bf16(float*, __nv_bfloat16*, const float*, const float*,
                                  const float*, int, float);
extern "C" void add_rms_norm_f16(float*, __half*, const float*, const float*, const float*,
                                 int, float);
extern "C" void argmax_rows_f32(unsigned long long*, const float*, int, int);
extern "C" void sampling_candidates_f32(unsigned*, unsigned*, float*, const unsigned long long*,
                                        const float*, const float*, int, int, int);

extern "C" {

struct EmuGrid {
    unsigned grid[3];
    unsigned block[3];
};

struct EmuAttention {
    void* out;
    int out_stride;
    float* part_ms;
    float* part_acc;
    const void* q;
    int q_stride;
    const void* k_cache;
    const void* v_cache;
    const u32* positions;
    const u32* tile_start;
    const u32* tile_len;
    const u32* seq_of_token;
    const u32* block_tables;
    int max_blocks;
    const u32* kv_of_q;
    int nq;
    int nkv;
    int block_size;
    float scale;
    int partition_size;
    int window;
};

struct EmuMerge {
    void* out;
    int out_stride;
    const float* part_ms;
    const float* part_acc;
    const u32* tile_start;
    int nq;
    int num_parts;
};

}  // extern "C"

namespace {

uint3 dims(const unsigned d[3]) { return {d[0], d[1], d[2]}; }

bool is(const char* name, const char* want) { return std::strcmp(name, want) == 0; }

template <typename T>
void attention(void (*f)(T*, int, float*, float*, const T*, int, const T*, const T*, const u32*,
                         const u32*, const u32*, const u32*, const u32*, int, const u32*, int,
                         int, int, float, int, int),
               const EmuGrid& g, const EmuAttention& a) {
    emu::run(dims(g.grid), dims(g.block), [&] {
        f(static_cast<T*>(a.out), a.out_stride, a.part_ms, a.part_acc,
          static_cast<const T*>(a.q), a.q_stride, static_cast<const T*>(a.k_cache),
          static_cast<const T*>(a.v_cache), a.positions, a.tile_start, a.tile_len,
          a.seq_of_token, a.block_tables, a.max_blocks, a.kv_of_q, a.nq, a.nkv, a.block_size,
          a.scale, a.partition_size, a.window);
    });
}

template <typename T>
void merge(void (*f)(T*, int, const float*, const float*, const u32*, int, int),
           const EmuGrid& g, const EmuMerge& m) {
    emu::run(dims(g.grid), dims(g.block), [&] {
        f(static_cast<T*>(m.out), m.out_stride, m.part_ms, m.part_acc, m.tile_start, m.nq,
          m.num_parts);
    });
}

}  // namespace

extern "C" int tessera_emu_attention(const char* name, const EmuGrid* g, const EmuAttention* a) {
#define RUN_ATTENTION(HD)                                                                   \
    if (is(name, "paged_attention_bf16_hd" #HD "_q1"))                                      \
        return attention(paged_attention_bf16_hd##HD##_q1, *g, *a), 0;                      \
    if (is(name, "paged_attention_bf16_hd" #HD "_q16"))                                     \
        return attention(paged_attention_bf16_hd##HD##_q16, *g, *a), 0;                     \
    if (is(name, "paged_attention_f16_hd" #HD "_q1"))                                       \
        return attention(paged_attention_f16_hd##HD##_q1, *g, *a), 0;                       \
    if (is(name, "paged_attention_f16_hd" #HD "_q16"))                                      \
        return attention(paged_attention_f16_hd##HD##_q16, *g, *a), 0;
    FOR_HEAD_DIMS(RUN_ATTENTION)
    return -1;
}

extern "C" int tessera_emu_merge(const char* name, const EmuGrid* g, const EmuMerge* m) {
#define RUN_MERGE(HD)                                                                       \
    if (is(name, "attention_merge_bf16_hd" #HD))                                            \
        return merge(attention_merge_bf16_hd##HD, *g, *m), 0;                               \
    if (is(name, "attention_merge_f16_hd" #HD)) return merge(attention_merge_f16_hd##HD, *g, *m), 0;
    FOR_HEAD_DIMS(RUN_MERGE)
    return -1;
}

extern "C" int tessera_emu_rope_write_kv(const char* name, const EmuGrid* g, void* qkv,
                                         int qkv_stride, void* k_cache, void* v_cache,
                                         const u32* positions, const u32* slots,
                                         const float* cos_table, const float* sin_table, int nq,
                                         int nkv, int hd, int interleaved) {
    auto go = [&](auto f, auto* typed) {
        using P = decltype(typed);
        emu::run(dims(g->grid), dims(g->block), [&] {
            f(static_cast<P>(qkv), qkv_stride, static_cast<P>(k_cache), static_cast<P>(v_cache),
              positions, slots, cos_table, sin_table, nq, nkv, hd, interleaved);
        });
        return 0;
    };
    if (is(name, "rope_write_kv_bf16")) return go(rope_write_kv_bf16, (__nv_bfloat16*)nullptr);
    if (is(name, "rope_write_kv_f16")) return go(rope_write_kv_f16, (__half*)nullptr);
    return -1;
}

extern "C" int tessera_emu_gated_mul(const char* name, const EmuGrid* g, void* out,
                                     const void* gate_up, int width, std::size_t total) {
    auto go = [&](auto f, auto* typed) {
        using P = decltype(typed);
        using C = const std::remove_pointer_t<P>*;
        emu::run(dims(g->grid), dims(g->block),
                 [&] { f(static_cast<P>(out), static_cast<C>(gate_up), width, total); });
        return 0;
    };
    if (is(name, "silu_mul_bf16")) return go(silu_mul_bf16, (__nv_bfloat16*)nullptr);
    if (is(name, "silu_mul_f16")) return go(silu_mul_f16, (__half*)nullptr);
    if (is(name, "gelu_tanh_mul_bf16")) return go(gelu_tanh_mul_bf16, (__nv_bfloat16*)nullptr);
    if (is(name, "gelu_tanh_mul_f16")) return go(gelu_tanh_mul_f16, (__half*)nullptr);
    return -1;
}

extern "C" int tessera_emu_add_rms_norm(const char* name, const EmuGrid* g, float* x_out,
                                        void* h, const float* x, const float* delta,
                                        const float* w, int cols, float eps) {
    auto go = [&](auto f, auto* typed) {
        using P = decltype(typed);
        emu::run(dims(g->grid), dims(g->block),
                 [&] { f(x_out, static_cast<P>(h), x, delta, w, cols, eps); });
        return 0;
    };
    if (is(name, "add_rms_norm_bf16")) return go(add_rms_norm_bf16, (__nv_bfloat16*)nullptr);
    if (is(name, "add_rms_norm_f16")) return go(add_rms_norm_f16, (__half*)nullptr);
    return -1;
}

extern "C" int tessera_emu_argmax_rows(const char* name, const EmuGrid* g,
                                       unsigned long long* keys, const float* logits, int cols,
                                       int per_block) {
    if (!is(name, "argmax_rows_f32")) return -1;
    emu::run(dims(g->grid), dims(g->block), [&] { argmax_rows_f32(keys, logits, cols, per_block); });
    return 0;
}

extern "C" int tessera_emu_sampling_candidates(const char* name, const EmuGrid* g,
                                               unsigned* counts, unsigned* ids, float* values,
                                               const unsigned long long* max_keys,
                                               const float* logits, const float* temperatures,
                                               int cols, int per_block, int cap) {
    if (!is(name, "sampling_candidates_f32")) return -1;
    emu::run(dims(g->grid), dims(g->block), [&] {
        sampling_candidates_f32(counts, ids, values, max_keys, logits, temperatures, cols,
                                per_block, cap);
    });
    return 0;
}
