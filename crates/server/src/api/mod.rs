//! The OpenAI wire format: request bodies as sent, their validation into a
//! [`valid_request::ValidRequest`], response bodies, errors and their envelopes, and the
//! OpenAPI document. Nothing here knows axum; the `serve` module does the HTTP.

pub mod chat_render;
pub mod chat_request;
pub mod completion_request;
pub mod error;
pub mod error_body;
pub mod generation_params;
pub mod generation_spec;
pub mod grammar_prep;
pub mod infill;
pub mod models;
pub mod openapi;
pub mod openapi_vllm;
pub mod reasoning;
pub mod reasoning_harmony;
pub mod request_limits;
pub mod response;
pub mod response_format;
pub mod responses_object;
pub mod responses_request;
pub mod structured_outputs;
pub mod tokenize;
pub mod tool_messages;
pub mod tool_parsers;
pub mod tool_prompt;
pub mod tools;
pub mod valid_request;

#[cfg(test)]
mod tool_chat_tests;

#[cfg(test)]
mod ignored_fields_tests;
