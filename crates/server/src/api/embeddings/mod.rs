//! `POST /v1/embeddings` (OpenAI's): the request as sent, and the reply.

pub mod reply;
pub mod request;
