//! Model families: how each family's files describe it, read into a `ModelConfig` from a
//! Hugging Face `config.json` (`hf_config`) or GGUF metadata (`gguf`).

mod gemma2;
pub(crate) mod gguf;
mod glm4_moe;
mod gpt_oss;
pub(crate) mod hf_config;
mod minimax_m2;
mod mixtral;
mod olmo3;
mod qwen3_moe;
mod smollm3;
