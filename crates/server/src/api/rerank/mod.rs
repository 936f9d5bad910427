//! `POST /v1/rerank` (and `/rerank`): Cohere's and Jina's request shape, scored by a
//! Qwen3-Reranker-style causal model: a document's score is the probability of `yes`
//! against `no` as the next token after the reranker's prompt.

pub mod prompt;
pub mod reply;
pub mod request;
