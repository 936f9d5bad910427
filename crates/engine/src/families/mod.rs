//! Model families: one file per family, and one table of them ([`FAMILIES`]).
//!
//! A family file states everything that is the family's own: the names a `config.json`
//! and a GGUF file give it, the features of its layer (the same in both formats), what
//! else each format says about it side by side (`from_hf`, `from_gguf`), where its files
//! name tensors otherwise than llama's, and the quantized checkpoints it is read from.
//! The readers of both formats (`hf`, `gguf`) look the family up in the table and read
//! what every family has alike; no other file of the engine names a family.
//!
//! A new family whose layer has no feature the decoder lacks is a file here, its `mod`
//! line and its row in the table below, and a test with its fixture
//! (`docs/architecture.md`). The table's test (`table.rs`) fails until the fixture test
//! exists.

mod gemma2;
mod gemma3;
pub(crate) mod gguf;
mod gguf_experts;
pub(crate) mod gguf_metadata;
mod glm4;
mod glm4_moe;
mod gpt_oss;
mod granite;
pub(crate) mod hf;
pub(crate) mod hf_config;
mod llama;
mod minimax_m2;
mod mistral;
mod mixtral;
mod olmo2;
mod olmo3;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_moe;
pub(crate) mod row;
mod smollm3;
pub mod table;

use row::Row;

/// Every family, one row each, in the order messages list them.
pub(crate) static FAMILIES: &[&Row] = &[
    &llama::ROW,
    &mistral::ROW,
    &mixtral::ROW,
    &qwen2::ROW,
    &qwen3::ROW,
    &qwen3_moe::ROW,
    &gemma2::ROW,
    &gemma3::ROW,
    &phi3::ROW,
    &smollm3::ROW,
    &granite::ROW,
    &glm4::ROW,
    &glm4_moe::ROW,
    &olmo2::ROW,
    &olmo3::ROW,
    &gpt_oss::ROW,
    &minimax_m2::ROW,
];
