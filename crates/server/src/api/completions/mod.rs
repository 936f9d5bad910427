//! `POST /v1/completions`: the request and fill-in-the-middle prompts.

pub mod infill;
pub mod request;
