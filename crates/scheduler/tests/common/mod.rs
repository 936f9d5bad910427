//! A fake executor that checks the plan contract and makes tokens depend on the KV it
//! reads back, so any block-table, prefix-sharing or preemption bug changes the output.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_protocol::FinishReason;
use tessera_protocol::{
    Executor, ExecutorError, FailedSequence, GenerationRequest, KvCacheShape, SampledToken,
    SamplingParams, StepOutput, StepPlan, StopCondition, TokenEvent,
};
use tessera_scheduler::TokenReceiver;
use tessera_scheduler::{Scheduler, SchedulerConfig};

/// Decides whether a step fails (checked before it runs).
pub type FailWhen = Box<dyn FnMut(&StepPlan) -> bool + Send>;

pub struct FakeExecutor {
    pub shape: KvCacheShape,
    pub max_context: usize,
    /// `kv[block][slot]`: the position and token whose KV was written there.
    kv: Vec<Vec<Option<(usize, u32)>>>,
    known: HashSet<tessera_protocol::SeqId>,
    /// Embedding sequences: their sample is an embedding (`[next_token as f32]`).
    pooled: HashSet<tessera_protocol::SeqId>,
    /// Guessed tokens the fake accepted, over all steps.
    pub accepted_guesses: usize,
    pub plans: Arc<Mutex<Vec<StepPlan>>>,
    pub fail_when: Option<FailWhen>,
    /// An injected failure has scope `Group` (the executor is gone), else `Step`.
    pub failure_is_fatal: bool,
    /// A chunk with this token fails its sequence alone (`StepOutput::failed`), the
    /// way a real executor refuses a token outside its embedding.
    pub poison_token: Option<u32>,
    pub step_delay: Duration,
}

impl FakeExecutor {
    pub fn new(num_blocks: usize, block_size: usize, max_context: usize) -> Self {
        Self {
            shape: KvCacheShape::new(num_blocks, block_size),
            max_context,
            kv: vec![vec![None; block_size]; num_blocks],
            known: HashSet::new(),
            pooled: HashSet::new(),
            accepted_guesses: 0,
            plans: Arc::new(Mutex::new(Vec::new())),
            fail_when: None,
            failure_is_fatal: false,
            poison_token: None,
            step_delay: Duration::ZERO,
        }
    }

    /// Every layer attends to its last `window` positions: a sample reads only those.
    pub fn with_window(mut self, window: usize) -> Self {
        self.shape.attention_window = Some(window);
        self
    }

    fn violation(msg: String) -> ExecutorError {
        ExecutorError::step(None, format!("contract violation: {msg}"))
    }
}

/// The next token given the whole context read back from the KV cache. Ids start at
/// 1000 so tests can use small ids as stop tokens without hitting them by accident.
pub fn next_token(context: &[u32]) -> u32 {
    let mut h = DefaultHasher::new();
    context.hash(&mut h);
    1000 + (h.finish() % 1000) as u32
}

impl Executor for FakeExecutor {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        self.plans.lock().unwrap().push(plan.clone());
        if !self.step_delay.is_zero() {
            std::thread::sleep(self.step_delay);
        }
        for id in &plan.finished {
            if !self.known.remove(id) {
                return Err(Self::violation(format!(
                    "finished {id} was never announced"
                )));
            }
        }
        for n in &plan.new_sequences {
            if !self.known.insert(n.id) {
                return Err(Self::violation(format!("{} announced twice", n.id)));
            }
            if n.sampling.pooling.is_some() {
                self.pooled.insert(n.id);
            }
        }
        // A real executor registers new sequences before its forward pass can fail, so
        // the failure is injected after the bookkeeping.
        if let Some(fail) = self.fail_when.as_mut() {
            if fail(plan) {
                let message = "injected device failure";
                return Err(if self.failure_is_fatal {
                    ExecutorError::group(Some(1), message)
                } else {
                    ExecutorError::step(Some(1), message)
                });
            }
        }
        let bs = self.shape.block_size_tokens;
        let mut samples = Vec::new();
        let mut failed = Vec::new();
        for c in &plan.scheduled {
            if let Some(bad) = self.poison_token.filter(|t| c.tokens.contains(t)) {
                failed.push(FailedSequence {
                    id: c.id,
                    message: format!("token {bad} is outside the embedding"),
                    by_request: false,
                });
                continue;
            }
            if !self.known.contains(&c.id) {
                return Err(Self::violation(format!(
                    "{} scheduled, not announced",
                    c.id
                )));
            }
            if c.block_table.len() * bs < c.end_pos() {
                return Err(Self::violation(format!(
                    "{}: table of {} blocks for {} tokens",
                    c.id,
                    c.block_table.len(),
                    c.end_pos()
                )));
            }
            for (k, &tok) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + k;
                self.kv[c.block_table[pos / bs] as usize][pos % bs] = Some((pos, tok));
            }
            if c.sample {
                let mut context = Vec::with_capacity(c.end_pos());
                // Guesses are scored like the executor scores them: a sample after the
                // last real token and after each guess, kept while each guess equals the
                // sample before it.
                let base = c.end_pos() - c.num_draft;
                let window_start = |end: usize| {
                    self.shape
                        .attention_window
                        .map_or(0, |w| end.saturating_sub(w))
                };
                let first = window_start(base);
                for pos in first..c.end_pos() {
                    let block = c.block_table[pos / bs] as usize;
                    match self.kv.get(block).map(|b| b[pos % bs]) {
                        Some(Some((p, t))) if p == pos => context.push(t),
                        Some(Some((p, _))) => {
                            return Err(Self::violation(format!(
                                "{}: position {pos} read from a slot that holds position {p}",
                                c.id
                            )))
                        }
                        Some(None) => {
                            return Err(Self::violation(format!(
                                "{}: position {pos} read before written",
                                c.id
                            )))
                        }
                        None => {
                            return Err(Self::violation(format!(
                                "{}: position {pos} read from block {block}, not in the cache",
                                c.id
                            )))
                        }
                    }
                }
                let sample_after =
                    |end: usize| next_token(&context[window_start(end) - first..end - first]);
                let token = sample_after(base);
                let mut accepted = Vec::new();
                let mut previous = token;
                for i in 0..c.num_draft {
                    if previous != c.tokens[c.tokens.len() - c.num_draft + i] {
                        break;
                    }
                    previous = sample_after(base + i + 1);
                    accepted.push((previous, None));
                }
                self.accepted_guesses += accepted.len();
                samples.push(SampledToken {
                    id: c.id,
                    token,
                    logprobs: None,
                    prompt_logprobs: None,
                    embedding: self.pooled.contains(&c.id).then(|| vec![token as f32]),
                    accepted,
                    proposed: Vec::new(),
                });
            }
        }
        Ok(StepOutput {
            samples,
            failed,
            draft: None,
        })
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        self.shape
    }

    fn max_context_tokens(&self) -> usize {
        self.max_context
    }
}

pub fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: prompt,
        sampling: SamplingParams::greedy(),
        stop: StopCondition {
            max_tokens,
            stop_token_ids: vec![],
            ignore_eos: false,
            request_stop_token_ids: Vec::new(),
        },
        cache_salt: None,
    }
}

/// Prompt of `len` tokens derived from `seed` (ids below 1000).
pub fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (seed * 31 + i * 7) % 997).collect()
}

/// Run schedule → step → update until no work is left, checking the KV manager's
/// invariants after every step. Returns the plans.
pub fn run(s: &mut Scheduler, ex: &mut FakeExecutor) -> Vec<StepPlan> {
    let mut plans = Vec::new();
    for _ in 0..100_000 {
        if !s.has_work() {
            return plans;
        }
        let plan = s.schedule();
        let out = ex.step(&plan).unwrap();
        s.update(&out).unwrap();
        s.kv_cache().check_invariants().unwrap();
        plans.push(plan);
    }
    panic!("scheduler did not finish in 100000 steps");
}

/// Everything a receiver has buffered: tokens and the terminal event, if any.
pub fn drain(rx: &mut TokenReceiver) -> (Vec<u32>, Option<TokenEvent>) {
    let mut tokens = Vec::new();
    let mut terminal = None;
    while let Ok(ev) = rx.try_recv() {
        match ev {
            TokenEvent::Token { token, .. } => {
                assert!(terminal.is_none(), "token after terminal event");
                tokens.push(token);
            }
            other => {
                assert!(terminal.is_none(), "two terminal events");
                terminal = Some(other);
            }
        }
    }
    (tokens, terminal)
}

/// What a correct run produces for `prompt`: greedy continuation by `next_token`.
pub fn expected_tokens(prompt: &[u32], n: usize) -> Vec<u32> {
    expected_windowed_tokens(prompt, n, usize::MAX)
}

/// The same when each sample reads only the last `window` tokens.
pub fn expected_windowed_tokens(prompt: &[u32], n: usize, window: usize) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = next_token(&ctx[ctx.len().saturating_sub(window)..]);
        ctx.push(t);
        out.push(t);
    }
    out
}

/// A config of `block`-token blocks, `batch` tokens and `seqs` sequences a step.
pub fn config(block: usize, batch: usize, seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size_tokens: block,
        max_batch_tokens: batch,
        max_num_seqs: seqs,
        ..SchedulerConfig::default()
    }
}

/// A scheduler over `ex`'s cache.
pub fn scheduler(cfg: &SchedulerConfig, ex: &FakeExecutor) -> Scheduler {
    Scheduler::new(cfg, ex.kv_cache_shape(), ex.max_context_tokens()).unwrap()
}

/// The `Finished` event of a sequence that ended for `reason`.
pub fn finished(reason: FinishReason, prompt: usize, completion: usize) -> Option<TokenEvent> {
    Some(TokenEvent::Finished {
        reason,
        prompt_tokens: prompt,
        completion_tokens: completion,
    })
}
