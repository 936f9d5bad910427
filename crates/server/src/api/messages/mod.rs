//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API,
//! run as the chat request it stands for.

mod blocks;
pub mod error;
pub mod reply;
pub mod request;
mod tools;
