//! The GPU checks (feature `cuda`): `scripts/test-gpu` runs this binary on a machine with
//! a GPU, one test at a time. Every check prints one line
//! `GPU-CHECK | <check> | <figure> | <bound>` that the script gathers into
//! `docs/gpu-verification.md`, and fails when its figure is outside its bound.
//!
//! - `attention`, `kernels`, `kv_8bit`: our CUDA kernels against plain host references on
//!   random inputs.
//! - `quant_matvec`: our quantized decode kernels against the host reference, and their
//!   timing against candle's `QMatMul` at the Llama-3.1-8B shapes (lines `QMV-TIMING`).
//! - `nccl`: the NCCL communicator at world size 1, and with 2 to 4 ranks sharing the one
//!   GPU (NCCL 2.30).
//! - `models`: random-weight models made by `scripts/gpu/make_models.py` (folder in
//!   `TESSERA_GPU_MODELS`): CUDA logits against the CPU engine and transformers, greedy
//!   text against the CPU engine, tensor parallelism on one GPU against TP = 1, and
//!   pooled embeddings against the CPU engine.
#![cfg(feature = "cuda")]

mod attention;
mod bench_files;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/gguf_writer.rs"]
mod gguf_writer;
mod kernels;
mod kv_8bit;
mod models;
mod nccl;
mod profile;
mod quant_matvec;
mod report;
