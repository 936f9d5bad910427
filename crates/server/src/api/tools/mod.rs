//! Tools: the request's tool definitions and choice, how a chat template is given them,
//! and the parsers that find calls in replies (one table row per family's form).

pub mod parsers;
pub mod prompt;
pub mod request;

#[cfg(test)]
mod chat_tests;
