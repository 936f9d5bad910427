//! CUDA kernels: launch planning and host references (plain Rust, tested anywhere) and,
//! with the `cuda` feature, the PTX that nvcc compiled from `kernels/cuda/*.cu`. The
//! engine loads the PTX into each rank's device and launches it on the rank's stream.

pub mod launch;
pub mod moe;
pub mod quant_matvec;
pub mod quant_reference;
pub mod quantized;
pub mod reference;

/// PTX modules, each with the names of the kernels it defines.
#[cfg(feature = "cuda")]
pub mod ptx {
    /// Paged attention and the merge of partitions (`launch::attention_kernel`,
    /// `launch::merge_kernel`).
    pub const ATTENTION: &str = include_str!(concat!(env!("OUT_DIR"), "/attention.ptx"));
    /// `rope_write_kv_{bf16,f16}`: RoPE on queries and keys, keys and values to the cache;
    /// `kv_store_{int8,fp8}_*` and `kv_fp8_scales_*`: an 8-bit cache's store
    /// (`quantized`).
    pub const KV_WRITE: &str = include_str!(concat!(env!("OUT_DIR"), "/kv_write.ptx"));
    /// `silu_mul_{bf16,f16}` and `gelu_tanh_mul_{bf16,f16}`: SiLU(gate) · up and
    /// GELU(gate) · up.
    pub const ACTIVATIONS: &str = include_str!(concat!(env!("OUT_DIR"), "/activations.ptx"));
    /// `add_rms_norm_{bf16,f16}`: residual add and RMSNorm in one pass.
    pub const NORM: &str = include_str!(concat!(env!("OUT_DIR"), "/norm.ptx"));
    /// `argmax_rows_f32`: the arg-max of each row of f32 logits.
    pub const ARGMAX: &str = include_str!(concat!(env!("OUT_DIR"), "/argmax.ptx"));
    /// `sampling_candidates_f32`: the tokens a temperature draw can pick, per row.
    pub const CANDIDATES: &str = include_str!(concat!(env!("OUT_DIR"), "/candidates.ptx"));
    /// `quantize_q8_act_{f32,bf16}` and `quant_matvec_{type}_r{rows}`: products over GGUF
    /// blocks for decode (`quant_matvec`).
    pub const QUANT_MATVEC: &str = include_str!(concat!(env!("OUT_DIR"), "/quant_matvec.ptx"));
    /// `moe_route_f32`, `moe_matvec_*` and `moe_combine_f32`: a mixture-of-experts layer of
    /// a few tokens on the device (`moe`).
    pub const MOE: &str = include_str!(concat!(env!("OUT_DIR"), "/moe.ptx"));
}
