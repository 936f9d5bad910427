//! Scheduler configuration and its validation against the executor's KV cache.

use tessera_protocol::KvCacheShape;

use crate::error::SchedulerError;
use crate::speculation::Speculation;

/// How the scheduler batches work. The KV cache shape itself comes from the executor;
/// `block_size_tokens` must agree with it (checked, never silently overridden).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Tokens per KV block; must equal the executor's `KvCacheShape::block_size_tokens`.
    pub block_size_tokens: usize,
    /// Upper bound on tokens run through the model in one step (prefill chunks + decodes).
    pub max_batch_tokens: usize,
    /// Upper bound on running sequences. Must not exceed `max_batch_tokens`, so every
    /// running sequence can decode in every step.
    pub max_num_seqs: usize,
    /// Requests allowed to wait for their first step; more are refused with `QueueFull`.
    pub max_waiting: usize,
    /// Longest context (prompt + generated) in tokens. `None` uses the executor's
    /// `max_context_tokens`; a larger value than the executor's is an error.
    pub max_model_len: Option<usize>,
    /// Share full KV blocks between sequences with the same token prefix.
    pub enable_prefix_caching: bool,
    /// Events a request's channel holds unread. A sequence whose client lets them pile
    /// up gets no more steps until it reads (backpressure); at least 2.
    pub max_buffered_events: usize,
    /// Guess tokens after each decoding sequence's last one, for the executor to verify.
    pub speculation: Option<Speculation>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            block_size_tokens: 16,
            max_batch_tokens: 2048,
            max_num_seqs: 64,
            max_waiting: 256,
            max_model_len: None,
            enable_prefix_caching: true,
            max_buffered_events: 64,
            speculation: None,
        }
    }
}

/// A config checked against one executor: every number here is usable as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedConfig {
    /// The executor's KV cache: blocks, their size, and the attention window when every
    /// layer slides.
    pub kv: KvCacheShape,
    pub max_batch_tokens: usize,
    pub max_num_seqs: usize,
    pub max_waiting: usize,
    pub max_model_len: usize,
    pub enable_prefix_caching: bool,
    pub max_buffered_events: usize,
    pub speculation: Option<Speculation>,
}

impl ResolvedConfig {
    /// Longest context one sequence can reach in the cache: its capacity, or no bound
    /// when an attention window keeps what a sequence holds within the cache.
    pub fn max_sequence_tokens(&self) -> usize {
        self.kv.max_sequence_tokens(self.max_batch_tokens)
    }
}

impl SchedulerConfig {
    /// Check this config against the executor's cache shape and context length.
    pub fn resolve(
        &self,
        shape: KvCacheShape,
        max_context_tokens: usize,
    ) -> Result<ResolvedConfig, SchedulerError> {
        let bad = |m: String| Err(SchedulerError::InvalidConfig(m));
        if self.block_size_tokens != shape.block_size_tokens {
            return bad(format!(
                "block_size_tokens is {} but the executor's KV cache uses blocks of {} tokens",
                self.block_size_tokens, shape.block_size_tokens
            ));
        }
        if shape.block_size_tokens == 0 || shape.num_blocks == 0 {
            return bad(format!(
                "executor KV cache is empty ({} blocks of {} tokens)",
                shape.num_blocks, shape.block_size_tokens
            ));
        }
        if u32::try_from(shape.num_blocks).is_err() {
            return bad(format!(
                "{} KV blocks do not fit 32-bit block ids",
                shape.num_blocks
            ));
        }
        if self.max_batch_tokens == 0 || self.max_num_seqs == 0 {
            return bad("max_batch_tokens and max_num_seqs must be at least 1".into());
        }
        if self.max_num_seqs > self.max_batch_tokens {
            return bad(format!(
                "max_num_seqs ({}) exceeds max_batch_tokens ({}): some running sequences \
                 could not decode in a step",
                self.max_num_seqs, self.max_batch_tokens
            ));
        }
        let max_model_len = match self.max_model_len {
            None => max_context_tokens,
            Some(n) if n > max_context_tokens => {
                return bad(format!(
                    "max_model_len ({n}) exceeds the model's context length ({max_context_tokens})"
                ))
            }
            Some(n) => n,
        };
        if self.max_buffered_events < 2 {
            return bad(format!(
                "max_buffered_events is {}; a request needs room for a token and its final event (2)",
                self.max_buffered_events
            ));
        }
        if let Some(s) = &self.speculation {
            s.check().map_err(SchedulerError::InvalidConfig)?;
        }
        if max_model_len == 0 {
            return bad("max_model_len must be at least 1".into());
        }
        Ok(ResolvedConfig {
            kv: shape,
            max_batch_tokens: self.max_batch_tokens,
            max_num_seqs: self.max_num_seqs,
            max_waiting: self.max_waiting,
            max_model_len,
            enable_prefix_caching: self.enable_prefix_caching,
            max_buffered_events: self.max_buffered_events,
            speculation: self.speculation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(blocks: usize, size: usize) -> KvCacheShape {
        KvCacheShape::new(blocks, size)
    }

    #[test]
    fn defaults_resolve_against_matching_shape() {
        let r = SchedulerConfig::default().resolve(shape(100, 16), 4096);
        let r = r.map_err(|e| e.to_string());
        assert_eq!(r.as_ref().map(|r| r.max_model_len), Ok(4096));
        assert_eq!(r.map(|r| r.kv.capacity_tokens()), Ok(1600));
    }

    #[test]
    fn block_size_mismatch_is_an_error_that_names_both_sizes() {
        let err = SchedulerConfig::default().resolve(shape(100, 32), 4096);
        let msg = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("16") && msg.contains("32"), "{msg}");
    }

    #[test]
    fn max_model_len_over_model_context_is_rejected() {
        let cfg = SchedulerConfig {
            max_model_len: Some(8192),
            ..SchedulerConfig::default()
        };
        assert!(cfg.resolve(shape(100, 16), 4096).is_err());
        let cfg = SchedulerConfig {
            max_model_len: Some(1000),
            ..SchedulerConfig::default()
        };
        assert_eq!(
            cfg.resolve(shape(100, 16), 4096).map(|r| r.max_model_len),
            Ok(1000)
        );
    }

    #[test]
    fn more_seqs_than_batch_tokens_is_rejected() {
        let cfg = SchedulerConfig {
            max_batch_tokens: 8,
            max_num_seqs: 9,
            ..SchedulerConfig::default()
        };
        assert!(cfg.resolve(shape(100, 16), 4096).is_err());
    }
}
