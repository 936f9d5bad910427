//! The OpenAPI 3.1 document of every route, with vLLM's request extensions.

mod components;
mod document;
mod embeddings;
mod messages;
mod rerank;
mod schema;
mod vllm;

pub use document::{document, document_for};
