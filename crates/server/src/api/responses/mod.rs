//! `POST /v1/responses`: the request as a chat, and the response object.

pub mod object;
pub mod request;
