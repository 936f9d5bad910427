//! The generation parameters every endpoint shares: the fields as sent, checked into a
//! generation spec within the per-request limits, and structured output (the formats
//! the fields name, and their compilation).

pub mod fields;
pub mod grammar;
pub mod limits;
pub mod response_format;
pub mod spec;
pub mod structured_outputs;

#[cfg(test)]
mod ignored_fields_tests;
