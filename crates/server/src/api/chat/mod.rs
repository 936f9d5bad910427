//! `POST /v1/chat/completions`: the request, its messages, and how they become the
//! prompt through the chat template.

pub mod message;
pub mod render;
pub mod request;
pub mod tool_messages;
