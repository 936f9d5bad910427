//! Token-budget scheduling: which sequences run in the next step, and what their
//! sampled tokens mean afterwards.
//!
//! The scheduler owns every sequence. `schedule()` and `update()` alternate strictly:
//! each plan is followed by `update` with the executor's output (or by `fail_all` when
//! the executor failed). Each plan respects `max_batch_tokens` (tokens across all chunks)
//! and `max_num_seqs` (running sequences).
//!
//! A sequence the executor refuses (`StepOutput::failed`) or whose step failed
//! (`fail_in_flight`) ends alone with `TokenEvent::Failed`; `fail_all` is for an
//! executor that is gone.
//!
//! Order of work in `schedule()` (after vLLM v1):
//! 1. sequences whose receiver is gone are aborted and their blocks freed;
//! 2. running sequences, oldest first, get their remaining tokens (unless their client
//!    has not read what it was sent: see [`crate::token_channel`]), 1 for a decode or a
//!    chunk for one still prefilling, while budget lasts; when blocks run out the newest
//!    running sequence is preempted (blocks freed, back to the front of the queue,
//!    recomputed later) until the current one fits or is itself preempted;
//! 3. if nothing was preempted, waiting sequences are admitted in FCFS order while budget,
//!    `max_num_seqs` and free blocks allow. The head of the queue is never skipped, so no
//!    request starves behind later ones. A prefix-cache hit starts the sequence at the
//!    end of its cached full blocks.
//!
//! Layers with a sliding window ([`KvCacheShape::attention_window`], in all layers or in
//! the sliding groups of a hybrid cache) release, in each step's `update`, the blocks
//! that the window of a sequence's next position has left: a sliding group holds at
//! most its window plus one chunk, however long a sequence runs.

use std::collections::{HashMap, VecDeque};
use std::mem;
use std::sync::Arc;
use std::time::Duration;

use tessera_protocol::{
    FinishReason, GenerationRequest, KvCacheShape, NewSequence, ScheduledChunk, SeqId, StepPlan,
    TokenEvent,
};

use crate::admission::{Admission, AdmittedRequest};
use crate::block_manager::KvCacheManager;
use crate::config::{ResolvedConfig, SchedulerConfig};
use crate::error::{AdmissionError, SchedulerError};
use crate::guesses::{guesses_for, ChunkGuesses};
use crate::metrics::SchedulerMetrics;
use crate::sequence::{Sequence, PROMPT_LOGPROBS_CHUNK};
use crate::speculation::{Proposal, Speculation, SpeculationCounters};
use crate::speculation_policy::StepCost;
use crate::token_channel::TokenReceiver;

mod update;

#[derive(Debug, Default)]
struct Counters {
    preemptions: u64,
    steps: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    prefix_queries: u64,
    prefix_hits: u64,
    last_step_duration: Duration,
    speculation: SpeculationCounters,
}

/// Continuous batching over a paged KV cache. Single-threaded: the engine loop owns it.
#[derive(Debug)]
pub struct Scheduler {
    cfg: ResolvedConfig,
    admission: Arc<Admission>,
    kv: KvCacheManager,
    seqs: HashMap<SeqId, Sequence>,
    /// FCFS; preempted sequences go back to the front.
    waiting: VecDeque<SeqId>,
    /// In admission order, so the newest (the preemption victim) is last.
    running: Vec<SeqId>,
    /// Announced sequences that ended; listed in the next plan's `finished`.
    pending_finished: Vec<SeqId>,
    /// Chunks of the plan in flight, in plan order: `(id, sample)`.
    in_flight: Vec<(SeqId, bool)>,
    /// The guesses of the chunks in flight that carry some.
    drafts_in_flight: HashMap<SeqId, Proposal>,
    /// Decode steps' time against their token rows: what a guess costs here.
    step_cost: StepCost,
    counters: Counters,
    /// Time from admission to first step of the sequences announced since the last
    /// [`Scheduler::take_queue_times`].
    queue_times: Vec<std::time::Duration>,
    /// Running sequences the last plan skipped because their clients are not reading.
    num_stalled: usize,
    /// Tokens of this step left for chunks that score prompts ([`PROMPT_LOGPROBS_CHUNK`]).
    scoring_left: usize,
}

impl Scheduler {
    /// A scheduler for an executor with this KV cache `shape` and context length.
    pub fn new(
        config: &SchedulerConfig,
        shape: KvCacheShape,
        max_context_tokens: usize,
    ) -> Result<Self, SchedulerError> {
        let cfg = config.resolve(shape, max_context_tokens)?;
        let admission = Admission::new(&cfg);
        Ok(Self::with_admission(cfg, admission))
    }

    /// A scheduler sharing `admission` with handles on other threads.
    pub fn with_admission(cfg: ResolvedConfig, admission: Arc<Admission>) -> Self {
        Self {
            kv: KvCacheManager::for_shape(cfg.kv, cfg.enable_prefix_caching),
            cfg,
            admission,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pending_finished: Vec::new(),
            in_flight: Vec::new(),
            drafts_in_flight: HashMap::new(),
            step_cost: StepCost::default(),
            counters: Counters::default(),
            queue_times: Vec::new(),
            num_stalled: 0,
            scoring_left: PROMPT_LOGPROBS_CHUNK,
        }
    }

    pub fn config(&self) -> &ResolvedConfig {
        &self.cfg
    }

    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    pub fn kv_cache(&self) -> &KvCacheManager {
        &self.kv
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Running sequences the last plan skipped because their clients are not reading
    /// (their channels are full). They run again once their clients read.
    pub fn num_stalled(&self) -> usize {
        self.num_stalled
    }

    /// True while there is anything to plan: sequences to run or ends to report.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || !self.pending_finished.is_empty()
    }

    /// Admit a request and queue it (admission control, then `add`).
    pub fn submit(
        &mut self,
        request: GenerationRequest,
    ) -> Result<(SeqId, TokenReceiver), AdmissionError> {
        let (admitted, receiver) = self.admission.admit(request)?;
        let id = admitted.id;
        self.add(admitted);
        Ok((id, receiver))
    }

    /// Queue an admitted request at the back of the waiting queue.
    pub fn add(&mut self, admitted: AdmittedRequest) {
        let seq = Sequence::new(admitted);
        self.waiting.push_back(seq.id);
        self.seqs.insert(seq.id, seq);
    }

    /// Plan the next step. See the module docs for the order of work.
    /// Queue times (admission to first step) recorded since the last call.
    pub fn take_queue_times(&mut self) -> Vec<std::time::Duration> {
        std::mem::take(&mut self.queue_times)
    }

    pub fn schedule(&mut self) -> StepPlan {
        debug_assert!(
            self.in_flight.is_empty(),
            "schedule() twice without update()"
        );
        self.in_flight.clear();
        self.abort_cancelled();
        let mut plan = StepPlan {
            finished: mem::take(&mut self.pending_finished),
            ..StepPlan::default()
        };
        let mut budget = self.cfg.max_batch_tokens;
        self.num_stalled = 0;
        self.scoring_left = PROMPT_LOGPROBS_CHUNK;
        let preempted = self.schedule_running(&mut plan, &mut budget);
        if !preempted {
            self.schedule_waiting(&mut plan, &mut budget);
        }
        // A step of decodes only (with or without guesses) measures what a row costs.
        let decodes_only = !plan.scheduled.is_empty()
            && plan
                .scheduled
                .iter()
                .all(|c| c.sample && c.tokens.len() == 1 + c.num_draft);
        self.step_cost
            .planned(decodes_only.then(|| plan.num_tokens()));
        plan
    }

    /// The executor failed: every in-flight request gets `TokenEvent::Error(message)`,
    /// every block is freed and the prefix cache is forgotten (its KV may be garbage).
    /// Announced sequences are listed in the next plan's `finished` so the executor
    /// drops their state; the scheduler then serves new requests as usual.
    pub fn fail_all(&mut self, message: &str) {
        self.drafts_in_flight.clear();
        self.end_all(|_| TokenEvent::Error(message.to_string()));
        self.kv.reset_prefix_cache();
    }

    /// The step in flight failed, and the executor can go on: the sequences of that
    /// step get `TokenEvent::Failed(message)` and end; every other sequence (running
    /// but not in the step, or waiting) is untouched, and so is the prefix cache: the
    /// failed step wrote only into blocks of its own sequences past their shared,
    /// committed prefix, and those blocks are freed here.
    pub fn fail_in_flight(&mut self, message: &str) {
        self.drafts_in_flight.clear();
        for (id, _) in mem::take(&mut self.in_flight) {
            self.end_with(id, TokenEvent::Failed(message.to_string()));
        }
    }

    /// Abort every sequence with `Finished { reason: Abort }` (shutdown).
    pub fn abort_all(&mut self) {
        self.end_all(|seq| seq.finished_event(FinishReason::Abort));
    }

    /// Record how long the last executor step took (for metrics).
    pub fn record_step_duration(&mut self, duration: Duration) {
        self.counters.last_step_duration = duration;
    }

    /// Zero the traffic counters (prompt and generated tokens, prefix-cache lookups):
    /// what ran before is not traffic (a server's warm-up). Steps and preemptions stay.
    pub fn clear_traffic_counters(&mut self) {
        let c = &mut self.counters;
        c.prompt_tokens = 0;
        c.generation_tokens = 0;
        c.prefix_queries = 0;
        c.prefix_hits = 0;
    }

    pub fn metrics(&self) -> SchedulerMetrics {
        let c = &self.counters;
        SchedulerMetrics {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_waiting_preempted: self
                .waiting
                .iter()
                .filter(|id| self.seqs.get(id).is_some_and(|s| s.permit.is_none()))
                .count(),
            kv_usage_fraction: self.kv.usage(),
            kv_blocks_in_use: self.kv.num_used_blocks(),
            kv_blocks_total: self.kv.num_blocks(),
            prefix_cache_queries_tokens: c.prefix_queries,
            prefix_cache_hits_tokens: c.prefix_hits,
            preemptions_total: c.preemptions,
            steps_total: c.steps,
            last_step_duration: c.last_step_duration,
            prompt_tokens_total: c.prompt_tokens,
            generation_tokens_total: c.generation_tokens,
            speculation: c.speculation.clone(),
        }
    }

    /// Step 2 of `schedule`. Returns whether any sequence was preempted.
    fn schedule_running(&mut self, plan: &mut StepPlan, budget: &mut usize) -> bool {
        let mut preempted = false;
        // Guesses pay while a step decodes few sequences (see `NgramSpeculation`), and
        // each only above the chance of being kept that its row's cost asks for (see
        // `speculation_policy`).
        let decoding = self
            .running
            .iter()
            .filter(|id| self.seqs.get(id).is_some_and(|s| s.num_uncomputed() == 1))
            .count();
        let speculation = self
            .cfg
            .speculation
            .filter(|s| decoding <= s.disable_by_batch_size());
        let threshold = match speculation {
            Some(Speculation::DraftModel(_)) => self.step_cost.draft_threshold(decoding),
            _ => self.step_cost.threshold(decoding),
        };
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            let Some(seq) = self.seqs.get_mut(&id) else {
                // Unreachable by construction (running ids always have a sequence);
                // dropping the id keeps the lists consistent if it ever happens.
                self.running.remove(i);
                continue;
            };
            let scoring = seq.scores_prompt();
            let cap = if scoring {
                self.scoring_left
            } else {
                usize::MAX
            };
            let num_new = seq.num_uncomputed().min(*budget).min(cap);
            // Backpressure: a client that is not reading gets no more tokens made.
            if num_new == 0 || !seq.sender.has_room_for_token() {
                self.num_stalled += usize::from(num_new > 0);
                i += 1;
                continue;
            }
            let guesses = match &speculation {
                Some(spec) if !scoring => guesses_for(
                    spec,
                    self.cfg.max_model_len,
                    seq,
                    num_new,
                    *budget,
                    threshold,
                ),
                _ => ChunkGuesses::default(),
            };
            // Room for the guesses too, or none are made.
            let guesses = match guesses.ahead() == 0
                || self
                    .kv
                    .grow(id, seq.num_computed_tokens + num_new + guesses.ahead())
                    .is_ok()
            {
                true => guesses,
                false => ChunkGuesses::default(),
            };
            let target = seq.num_computed_tokens + num_new;
            let mut fits = true;
            while self.kv.grow(id, target).is_err() {
                // Victims come from the end, at or after `i`: sequences already planned
                // in this step are never preempted.
                let Some(victim) = self.running.pop() else {
                    fits = false;
                    break;
                };
                self.preempt(victim);
                preempted = true;
                if victim == id {
                    fits = false;
                    break;
                }
            }
            if !fits {
                break;
            }
            *budget -= num_new + guesses.drafts.tokens.len();
            self.push_chunk(plan, id, num_new, guesses);
            if scoring {
                self.scoring_left -= num_new;
            }
            i += 1;
        }
        preempted
    }

    /// Step 3 of `schedule`: FCFS admission from the waiting queue.
    fn schedule_waiting(&mut self, plan: &mut StepPlan, budget: &mut usize) {
        while *budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let Some(seq) = self.seqs.get(&id) else {
                self.waiting.pop_front();
                continue;
            };
            // Prompt log-probabilities need the logits of every prompt position, and
            // mean or first-token pooling their hidden states.
            let every_position = seq.sampling.prompt_logprobs.is_some()
                || seq
                    .sampling
                    .pooling
                    .is_some_and(|p| p.kind.needs_every_position());
            let hit = match every_position {
                true => self.kv.find_prefix_salted(&[], seq.cache_salt.as_deref()),
                false => self
                    .kv
                    .find_prefix_salted(&seq.tokens, seq.cache_salt.as_deref()),
            };
            // `find_prefix` leaves at least one token uncomputed, so `num_new >= 1`.
            let scoring = seq.scores_prompt();
            let cap = if scoring {
                self.scoring_left
            } else {
                usize::MAX
            };
            let num_new = (seq.num_tokens() - hit.num_tokens()).min(*budget).min(cap);
            if num_new == 0 {
                // Scoring tokens are spent for this step; the head waits for the next.
                break;
            }
            let Ok(cached) = self.kv.allocate(id, &hit, hit.num_tokens() + num_new) else {
                // The head does not fit yet: wait for blocks rather than let a smaller
                // request overtake it.
                break;
            };
            self.waiting.pop_front();
            self.running.push(id);
            if scoring {
                self.scoring_left -= num_new;
            }
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            seq.num_computed_tokens = cached;
            seq.permit = None;
            if self.cfg.enable_prefix_caching {
                self.counters.prefix_queries += seq.num_tokens() as u64;
                self.counters.prefix_hits += cached as u64;
            }
            if !seq.announced {
                seq.announced = true;
                seq.report_cached_prompt_tokens(cached.min(seq.prompt_len));
                self.queue_times.push(seq.submitted.elapsed());
                self.counters.prompt_tokens += seq.prompt_len as u64;
                plan.new_sequences.push(NewSequence {
                    id,
                    sampling: seq.sampling.clone(),
                    prompt_ids: seq.tokens[..seq.prompt_len].to_vec(),
                });
            }
            self.push_chunk(plan, id, num_new, ChunkGuesses::default());
            *budget -= num_new;
        }
    }

    /// Plan `num_new` tokens of `id` starting at its computed count, and count them as
    /// computed (the step either succeeds or `fail_all` discards everything).
    fn push_chunk(
        &mut self,
        plan: &mut StepPlan,
        id: SeqId,
        num_new: usize,
        guesses: ChunkGuesses,
    ) {
        let ChunkGuesses { drafts, propose } = guesses;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let start_pos = seq.num_computed_tokens;
        let end = start_pos + num_new;
        let sample = end == seq.num_tokens();
        seq.num_computed_tokens = end;
        let mut tokens = seq.tokens[start_pos..end].to_vec();
        tokens.extend(&drafts.tokens);
        let num_draft = drafts.tokens.len();
        if num_draft > 0 {
            self.drafts_in_flight.insert(id, drafts);
        }
        let (block_table, group_tables) = self.kv.chunk_tables(id);
        plan.scheduled.push(ScheduledChunk {
            id,
            tokens,
            start_pos,
            block_table,
            sample,
            num_draft,
            propose,
            group_tables,
        });
        self.in_flight.push((id, sample));
    }

    /// Free a running sequence's blocks and queue it for recompute at the front.
    fn preempt(&mut self, id: SeqId) {
        self.kv.free(id);
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.num_computed_tokens = 0;
        }
        self.waiting.push_front(id);
        self.counters.preemptions += 1;
        tracing::debug!(seq = %id, "preempted: KV blocks exhausted");
    }

    fn abort_cancelled(&mut self) {
        let cancelled: Vec<SeqId> = self
            .seqs
            .values()
            .filter(|s| s.is_cancelled())
            .map(|s| s.id)
            .collect();
        for id in cancelled {
            tracing::debug!(seq = %id, "receiver dropped: aborting");
            self.finish(id, None);
        }
    }

    /// Remove a sequence for good: optional final event, blocks freed, and the executor
    /// told (next plan) if it knows the sequence.
    fn finish(&mut self, id: SeqId, reason: Option<FinishReason>) {
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        if let Some(reason) = reason {
            seq.send(seq.finished_event(reason));
        }
        self.kv.free(id);
        self.running.retain(|r| *r != id);
        self.waiting.retain(|w| *w != id);
        if seq.announced {
            self.pending_finished.push(id);
        }
    }

    /// Remove a sequence for good with `event` as its last word.
    fn end_with(&mut self, id: SeqId, event: TokenEvent) {
        if let Some(seq) = self.seqs.get(&id) {
            seq.send(event);
        }
        self.finish(id, None);
    }

    fn end_all(&mut self, event: impl Fn(&Sequence) -> TokenEvent) {
        for (id, seq) in self.seqs.drain() {
            seq.send(event(&seq));
            self.kv.free(id);
            if seq.announced {
                self.pending_finished.push(id);
            }
        }
        self.running.clear();
        self.waiting.clear();
        self.in_flight.clear();
    }
}
