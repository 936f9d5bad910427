//! Limits on the request fields whose size the client chooses: how many choices (`n`
//! times the number of prompts), stop strings (count and length) and `logit_bias`
//! entries. Each is a `tessera serve` flag; over a limit the request gets a 400 that
//! names the parameter.

/// The per-request field limits. [`Default`] matches the flags' defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Most choices one request may ask for (`n` times the number of prompts).
    pub max_choices: usize,
    /// Most stop strings per request.
    pub max_stop_strings: usize,
    /// Longest stop string, in bytes.
    pub max_stop_string_bytes: usize,
    /// Most `logit_bias` entries per request.
    pub max_logit_bias: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_choices: 16,
            max_stop_strings: 16,
            max_stop_string_bytes: 256,
            max_logit_bias: 300,
        }
    }
}
