//! The wire format of every endpoint, grouped by what it serves: request bodies as sent,
//! their validation into a [`valid_request::ValidRequest`], response bodies, errors and
//! their envelopes, and the OpenAPI document. Nothing here knows axum; the `serve`
//! module does the HTTP.
//!
//! - `chat/`, `completions/`, `responses/`: each endpoint's request (and its own parts);
//! - `params/`: the generation parameters every endpoint shares, their limits, and
//!   structured output (formats and their compilation);
//! - `tools/`: tool definitions, how a template is given them, and one parser per
//!   family's form of calls;
//! - `reasoning/`: splitting a reply's thinking from its answer;
//! - `openapi/`: the OpenAPI document.

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod error;
pub mod error_body;
pub mod messages;
pub mod models;
pub mod openapi;
pub mod params;
pub mod reasoning;
pub mod rerank;
pub mod response;
pub mod responses;
pub mod tokenize;
pub mod tools;
pub mod valid_request;
