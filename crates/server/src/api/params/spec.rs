//! Checks the shared generation fields and turns them into engine terms.

use tessera_protocol::{OutputConstraint, SamplingParams};

use crate::api::error::ServerError;
use crate::api::params::fields::{GenerationParams, StopField};
use crate::api::params::limits::RequestLimits;
use crate::api::params::response_format::parse_response_format;
use crate::api::params::structured_outputs::{one_only, parse_vllm_constraint};

/// Most alternatives per token in logprobs (OpenAI's limit for chat).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The shared fields, checked. The prompt-dependent limits are checked later.
#[derive(Debug, Clone)]
pub struct GenerationSpec {
    pub model: String,
    /// `max_completion_tokens`, else `max_tokens`; `None` means the route's default.
    pub max_tokens: Option<usize>,
    pub n: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
    /// The field that set `sampling.constraint` (errors about it name that field).
    pub constraint_param: &'static str,
    pub ignore_eos: bool,
    /// The request's own stop tokens (`stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
    pub min_tokens: usize,
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    /// Prefix-cache isolation (`cache_salt`).
    pub cache_salt: Option<String>,
    /// Words the output may not contain (`bad_words`), tokenized by `ValidRequest`.
    pub bad_words: Vec<String>,
    /// Keep the last this many prompt tokens (`truncate_prompt_tokens`); `Some(None)`
    /// keeps as many as the context holds with room for one generated token.
    pub truncate_prompt_tokens: Option<Option<usize>>,
    pub stream: bool,
    pub include_usage: bool,
}

fn check_range(param: &str, value: f64, lo: f64, hi: f64) -> Result<f32, ServerError> {
    if !value.is_finite() || value < lo || value > hi {
        return Err(ServerError::invalid(
            param,
            format!("`{param}` must be between {lo} and {hi}, got {value}"),
        ));
    }
    Ok(value as f32)
}

impl GenerationSpec {
    /// Check every shared field. `vocab_size` bounds `logit_bias` keys; `limits` bounds
    /// `n`, `stop` and `logit_bias`.
    pub fn from_params(
        p: &GenerationParams,
        vocab_size: usize,
        limits: &RequestLimits,
    ) -> Result<Self, ServerError> {
        let max_tokens = match (p.max_completion_tokens, p.max_tokens) {
            (Some(v), _) => Some(("max_completion_tokens", v)),
            (None, Some(v)) => Some(("max_tokens", v)),
            (None, None) => None,
        };
        let max_tokens = match max_tokens {
            Some((param, 0)) => {
                return Err(ServerError::invalid(
                    param,
                    format!("`{param}` must be at least 1"),
                ))
            }
            Some((_, v)) => Some(usize::try_from(v).unwrap_or(usize::MAX)),
            None => None,
        };
        let n = usize::try_from(p.n.unwrap_or(1)).unwrap_or(usize::MAX);
        let max_n = limits.max_choices;
        if n == 0 || n > max_n {
            return Err(ServerError::invalid(
                "n",
                format!("`n` must be between 1 and {max_n}, got {n}"),
            ));
        }
        if let Some(best_of) = p.best_of {
            if best_of != 1 && best_of != n as u64 {
                return Err(ServerError::invalid(
                    "best_of",
                    "`best_of` other than 1 or `n` is not supported",
                ));
            }
        }
        let mut sampling = SamplingParams::default();
        if let Some(t) = p.temperature {
            sampling.temperature = check_range("temperature", t, 0.0, 2.0)?;
        }
        if let Some(v) = p.top_p {
            sampling.top_p = check_range("top_p", v, 0.0, 1.0)?;
            if sampling.top_p <= 0.0 {
                return Err(ServerError::invalid("top_p", "`top_p` must be above 0"));
            }
        }
        if let Some(k) = p.top_k {
            sampling.top_k = match k {
                -1 | 0 => 0,
                k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
                k => {
                    return Err(ServerError::invalid(
                        "top_k",
                        format!("`top_k` must be -1, 0 (disabled) or positive, got {k}"),
                    ))
                }
            };
        }
        if let Some(v) = p.min_p {
            sampling.min_p = check_range("min_p", v, 0.0, 1.0)?;
        }
        if let Some(v) = p.presence_penalty {
            sampling.presence_penalty = check_range("presence_penalty", v, -2.0, 2.0)?;
        }
        if let Some(v) = p.frequency_penalty {
            sampling.frequency_penalty = check_range("frequency_penalty", v, -2.0, 2.0)?;
        }
        if let Some(v) = p.repetition_penalty {
            sampling.repetition_penalty = check_range("repetition_penalty", v, 0.0, 2.0)?;
            if sampling.repetition_penalty <= 0.0 {
                return Err(ServerError::invalid(
                    "repetition_penalty",
                    "`repetition_penalty` must be above 0",
                ));
            }
        }
        // A negative seed is a valid 64-bit pattern; keep its bits.
        sampling.seed = p.seed.map(|s| s as u64);
        if let Some(bias) = &p.logit_bias {
            if bias.len() > limits.max_logit_bias {
                return Err(ServerError::invalid(
                    "logit_bias",
                    format!(
                        "`logit_bias` has {} entries; at most {} are allowed",
                        bias.len(),
                        limits.max_logit_bias
                    ),
                ));
            }
            for (key, value) in bias {
                let id: u32 = key.parse().map_err(|_| {
                    ServerError::invalid(
                        "logit_bias",
                        format!("logit_bias key `{key}` is not a token id"),
                    )
                })?;
                if id as usize >= vocab_size {
                    return Err(ServerError::invalid(
                        "logit_bias",
                        format!(
                            "logit_bias token id {id} is out of range (vocabulary size {vocab_size})"
                        ),
                    ));
                }
                let v = check_range("logit_bias", *value, -100.0, 100.0)?;
                sampling.logit_bias.push((id, v));
            }
        }
        let stop_strings = match &p.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop_strings.len() > limits.max_stop_strings {
            return Err(ServerError::invalid(
                "stop",
                format!(
                    "at most {} stop strings are allowed",
                    limits.max_stop_strings
                ),
            ));
        }
        if let Some(long) = stop_strings
            .iter()
            .find(|s| s.len() > limits.max_stop_string_bytes)
        {
            return Err(ServerError::invalid(
                "stop",
                format!(
                    "a stop string is {} bytes; at most {} are allowed",
                    long.len(),
                    limits.max_stop_string_bytes
                ),
            ));
        }
        if stop_strings.iter().any(String::is_empty) {
            return Err(ServerError::invalid(
                "stop",
                "stop strings must not be empty",
            ));
        }
        let from_format = parse_response_format(p.response_format.as_ref())?;
        let mut constraint_param = "response_format";
        match (from_format, parse_vllm_constraint(p)?) {
            (Some(_), Some((param, _))) => return Err(one_only(param, "response_format")),
            (Some(c), None) => sampling.constraint = Some(c),
            (None, Some((param, c))) => {
                constraint_param = param;
                sampling.constraint = Some(c);
            }
            (None, None) => {}
        }
        let ignore_eos = p.ignore_eos.unwrap_or(false);
        let stop_token_ids = p.stop_token_ids.clone().unwrap_or_default();
        if stop_token_ids.len() > limits.max_logit_bias {
            return Err(ServerError::invalid(
                "stop_token_ids",
                format!(
                    "`stop_token_ids` has {} entries; at most {} are allowed",
                    stop_token_ids.len(),
                    limits.max_logit_bias
                ),
            ));
        }
        check_in_vocab("stop_token_ids", &stop_token_ids, vocab_size)?;
        let min_tokens = usize::try_from(p.min_tokens.unwrap_or(0)).unwrap_or(usize::MAX);
        if let Some(max) = max_tokens.filter(|max| min_tokens > *max) {
            return Err(ServerError::invalid(
                "min_tokens",
                format!("`min_tokens` ({min_tokens}) must not exceed the token budget ({max})"),
            ));
        }
        let truncate_prompt_tokens = match p.truncate_prompt_tokens {
            None => None,
            Some(-1) => Some(None),
            Some(k) if k >= 1 => Some(Some(usize::try_from(k).unwrap_or(usize::MAX))),
            Some(k) => {
                return Err(ServerError::invalid(
                    "truncate_prompt_tokens",
                    format!("`truncate_prompt_tokens` must be -1 or at least 1, got {k}"),
                ))
            }
        };
        let allowed = p.allowed_token_ids.clone().unwrap_or_default();
        check_in_vocab("allowed_token_ids", &allowed, vocab_size)?;
        sampling.allowed_token_ids = allowed;
        let bad_words = p.bad_words.clone().unwrap_or_default();
        if bad_words.len() > limits.max_stop_strings
            || bad_words
                .iter()
                .any(|w| w.len() > limits.max_stop_string_bytes)
        {
            return Err(ServerError::invalid(
                "bad_words",
                format!(
                    "at most {} bad words of at most {} bytes each are allowed",
                    limits.max_stop_strings, limits.max_stop_string_bytes
                ),
            ));
        }
        if bad_words.iter().any(|w| w.trim().is_empty()) {
            return Err(ServerError::invalid(
                "bad_words",
                "bad words must not be empty",
            ));
        }
        let cache_salt = p.cache_salt.clone();
        if cache_salt.as_deref() == Some("") {
            return Err(ServerError::invalid(
                "cache_salt",
                "`cache_salt` must be a non-empty string",
            ));
        }
        let stream = p.stream.unwrap_or(false);
        let include_usage = match &p.stream_options {
            Some(o) if !stream => {
                if o.include_usage.is_some() {
                    return Err(ServerError::invalid(
                        "stream_options",
                        "`stream_options` is only allowed with `stream`: true",
                    ));
                }
                false
            }
            Some(o) => o.include_usage.unwrap_or(false),
            None => false,
        };
        let spec = GenerationSpec {
            model: p.model.clone(),
            max_tokens,
            n,
            sampling,
            stop_strings,
            constraint_param,
            ignore_eos,
            stop_token_ids,
            min_tokens,
            include_stop_str_in_output: p.include_stop_str_in_output.unwrap_or(false),
            skip_special_tokens: p.skip_special_tokens.unwrap_or(true),
            cache_salt,
            truncate_prompt_tokens,
            bad_words,
            stream,
            include_usage,
        };
        spec.check_constrained()?;
        Ok(spec)
    }

    /// Constrains the output to `constraint`, which `param` asked for (forced tool calls,
    /// known only after the shared fields are checked).
    pub fn constrain(
        &mut self,
        constraint: OutputConstraint,
        param: &'static str,
    ) -> Result<(), ServerError> {
        self.sampling.constraint = Some(constraint);
        self.constraint_param = param;
        self.check_constrained()
    }

    /// Refuses the fields a constrained output cannot honour: it ends when the grammar
    /// is complete, and its mask leaves no room for an allow-list.
    fn check_constrained(&self) -> Result<(), ServerError> {
        if self.sampling.constraint.is_none() {
            return Ok(());
        }
        let param = self.constraint_param;
        let ends = ": the output ends when it is complete";
        let conflicts = [
            (self.ignore_eos, "ignore_eos", ends),
            (self.min_tokens > 0, "min_tokens", ends),
            (
                !self.sampling.allowed_token_ids.is_empty(),
                "allowed_token_ids",
                "",
            ),
        ];
        match conflicts.into_iter().find(|c| c.0) {
            Some((_, field, why)) => Err(ServerError::invalid(
                field,
                format!("`{field}` cannot be combined with `{param}`{why}"),
            )),
            None => Ok(()),
        }
    }
}

/// Refuses token ids outside the model's vocabulary, naming `param`.
pub fn check_in_vocab(param: &str, ids: &[u32], vocab_size: usize) -> Result<(), ServerError> {
    match ids.iter().find(|&&id| id as usize >= vocab_size) {
        Some(id) => Err(ServerError::invalid(
            param,
            format!("token id {id} is out of range (vocabulary size {vocab_size})"),
        )),
        None => Ok(()),
    }
}

/// Check a logprobs alternatives count.
pub fn check_top_logprobs(param: &str, value: u64) -> Result<usize, ServerError> {
    let v = usize::try_from(value).unwrap_or(usize::MAX);
    if v > MAX_TOP_LOGPROBS {
        return Err(ServerError::invalid(
            param,
            format!("`{param}` must be between 0 and {MAX_TOP_LOGPROBS}, got {value}"),
        ));
    }
    Ok(v)
}
