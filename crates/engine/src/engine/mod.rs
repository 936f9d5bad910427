//! The engine: loads a model into one shard per device, runs a worker thread per device,
//! and implements the scheduler's [`Executor`] (the driver samples on the calling thread).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_protocol::{
    Executor, ExecutorError, FailedSequence, KvCacheShape, SampledToken, ScheduledChunk, SeqId,
    StepOutput, StepPlan,
};

use crate::device::device_spec::DeviceSpec;
use crate::error::{EngineError, Result};
use crate::model::batch::{PoolSpan, RowReduce};
use crate::model::decoder::Pooled;
use crate::model::{Batch, ChunkLimits};
use crate::prompt_logprobs::PromptLogprobs;
use crate::sampler::Sampler;
use crate::spec::model::ModelConfig;
use crate::stats::EngineStats;
use crate::structured::start_constraint;
use crate::tp::ShardPlan;
use crate::worker::{self, Fault, Job, WorkerHandle};

use embedding::PoolState;
use verify::{sample_rows, Row};

mod auto_map;
pub mod draft;
mod embedding;
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
mod graphs;
mod kv_calibration;
mod kv_sizing;
mod load;
mod mtp;
mod nodes;
mod placement;
mod verify;
mod worker_node;

struct SeqState {
    sampler: Sampler,
    /// When the sequence asked for its prompt's log-probabilities.
    prompt: Option<PromptLogprobs>,
    /// An embedding sequence's pooled hidden states so far.
    pool: Option<PoolState>,
}

/// A loaded model on its group of devices.
pub struct Engine {
    workers: Vec<WorkerHandle>,
    /// Each worker's device and the layers it runs.
    layers: Vec<(DeviceSpec, std::ops::Range<usize>)>,
    /// The routed experts of layers `0..n` run on the host.
    host_expert_layers: usize,
    config: ModelConfig,
    plan: ShardPlan,
    kv: KvCacheShape,
    /// Bytes one KV block takes on the rank that holds the most per block.
    kv_block_bytes: usize,
    /// Some rank's cache is fp8, whose scales a warm-up step sets.
    kv_fp8: bool,
    sequences: HashMap<SeqId, SeqState>,
    pub(crate) step_timeout: Duration,
    /// Set when the group failed (a device, a collective, a hung rank): nothing more runs.
    failed: Option<String>,
    /// How to give the ranks fresh communicators after a step-only failure.
    groups: placement::CommGroups,
    stats: EngineStats,
    /// On a worker node of a group of nodes: the connection its steps come from.
    pub(crate) leader: Option<crate::cluster::links::LeaderLink>,
    /// On the leader of a group of nodes: word of a worker node lost while idle.
    node_loss: Option<crate::cluster::node_loss::NodeLoss>,
    /// With the model's MTP layer loaded: the tokens of the sequences it guesses for.
    mtp: Option<mtp::MtpSeqs>,
    /// The ranks' decode graphs.
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    graphs: graphs::EngineGraphs,
}

impl Engine {
    /// Per-rank counters (steps, time in steps and in collectives); they keep counting
    /// after the engine has moved to its loop.
    pub fn stats(&self) -> EngineStats {
        self.stats.clone()
    }

    /// Bytes one KV block takes on the rank that holds the most per block: what the
    /// cache's memory is divided by.
    pub fn kv_block_bytes(&self) -> usize {
        self.kv_block_bytes
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn shard_plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// Each worker's device and the decoder layers it runs: every layer on each
    /// tensor-parallel rank, a range on each pipeline stage (the host's as `cpu:0`, last).
    pub fn layer_placement(&self) -> &[(DeviceSpec, std::ops::Range<usize>)] {
        &self.layers
    }

    /// The routed experts of layers `0..n` are on the host (`--n-cpu-moe`, or the
    /// automatic layer map's choice).
    pub fn host_expert_layers(&self) -> usize {
        self.host_expert_layers
    }

    /// On the leader of a group of nodes, how it hears of a worker node lost between
    /// steps (taken once; the caller fails the engine loop when it hears).
    pub fn take_node_loss(&mut self) -> Option<crate::cluster::node_loss::NodeLoss> {
        self.node_loss.take()
    }

    /// Test hook: the next step fails on `rank` in the given way. A rank of a worker node
    /// gets it through the node's connection, ahead of the next step.
    pub fn inject_fault(&self, rank: usize, fault: Fault) -> Result<()> {
        let w = self
            .workers
            .iter()
            .find(|w| (w.rank..w.rank + w.span).contains(&rank))
            .ok_or_else(|| EngineError::Parallel(format!("no rank {rank}")))?;
        w.jobs
            .send(Job::Inject { rank, fault })
            .map_err(|_| EngineError::Rank {
                rank,
                message: "worker is gone".into(),
            })
    }

    /// Runs the batch on every rank; returns rank 0's logits `[rows * vocab]`.
    pub fn forward(&mut self, mut batch: Batch) -> Result<Vec<f32>> {
        batch.row_reduce.clear();
        Ok(self.forward_rows(batch)?.values)
    }

    /// Runs the batch on every rank; returns the sampled rows as the logits-returning
    /// rank handed them back (rows in `batch.row_reduce` may come reduced).
    fn forward_rows(&mut self, batch: Batch) -> Result<worker::StepLogits> {
        self.dispatch(batch)?
            .ok_or_else(|| EngineError::Step("no rank returned logits".into()))
    }

    /// Runs the batch on every rank this engine drives; the logits come back when one
    /// of them returns them (on a worker node of a group of nodes, none does).
    pub(crate) fn dispatch(&mut self, batch: Batch) -> Result<Option<worker::StepLogits>> {
        let batch = Arc::new(batch);
        self.dispatch_job(|| Job::Step(batch.clone()))
    }

    /// Runs a job that computes (a step, an MTP pass) on every rank this engine drives,
    /// each given its own `job()`; the logits come back when one of them returns them.
    fn dispatch_job(&mut self, job: impl Fn() -> Job) -> Result<Option<worker::StepLogits>> {
        if let Some(reason) = &self.failed {
            return Err(EngineError::GroupFailed {
                rank: None,
                message: format!("engine failed earlier: {reason}"),
            });
        }
        for w in &self.workers {
            if w.jobs.send(job()).is_err() {
                return Err(self.fail_group(EngineError::GroupFailed {
                    rank: Some(w.rank),
                    message: "worker thread is gone".into(),
                }));
            }
        }
        // Ranks waiting on a hung peer give up after `step_timeout` and name it; allow them a
        // moment to say so before blaming whoever has not answered.
        let deadline = Instant::now() + self.step_timeout + Duration::from_secs(1);
        let mut logits = None;
        let mut root_cause: Option<EngineError> = None;
        let mut aborted: Option<EngineError> = None;
        for w in &self.workers {
            let wait = deadline.saturating_duration_since(Instant::now());
            match w.results.recv_timeout(wait) {
                Ok(Ok(Some(l))) => logits = Some(l),
                Ok(Ok(None)) => {}
                Ok(Err(e @ EngineError::CommAborted(_))) => {
                    aborted.get_or_insert(EngineError::GroupFailed {
                        rank: Some(w.rank),
                        message: e.to_string(),
                    });
                }
                Ok(Err(e)) => {
                    root_cause.get_or_insert(e);
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    root_cause.get_or_insert(EngineError::GroupFailed {
                        rank: Some(w.rank),
                        message: format!("did not finish the step within {:?}", self.step_timeout),
                    });
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    root_cause.get_or_insert(EngineError::GroupFailed {
                        rank: Some(w.rank),
                        message: "worker thread exited".into(),
                    });
                }
            }
        }
        // A collective that failed with no rank to blame is a group failure.
        match root_cause.or(aborted) {
            None => Ok(logits),
            Some(e) if e.fails_group() => Err(self.fail_group(e)),
            Some(e) => {
                tracing::error!("step failed, the group reconnects: {e}");
                match self.reconnect() {
                    Ok(()) => Err(e),
                    Err(lost) => Err(self.fail_group(EngineError::GroupFailed {
                        rank: None,
                        message: format!("{e}; then the group could not reconnect: {lost}"),
                    })),
                }
            }
        }
    }

    /// Marks the group failed for good; nothing more runs.
    fn fail_group(&mut self, e: EngineError) -> EngineError {
        tracing::error!("device group failed: {e}");
        self.failed = Some(e.to_string());
        e
    }

    /// After a step-only failure every rank has answered and is idle, and the failing
    /// one aborted the group's communicator: give every rank a fresh one.
    fn reconnect(&mut self) -> Result<()> {
        let endpoints = self.groups.endpoints()?;
        for (w, endpoint) in self.workers.iter().zip(endpoints) {
            w.jobs
                .send(Job::Reconnect(endpoint))
                .map_err(|_| EngineError::GroupFailed {
                    rank: Some(w.rank),
                    message: "worker thread is gone".into(),
                })?;
        }
        let deadline = Instant::now() + self.step_timeout;
        let mut first_error = None;
        for w in &self.workers {
            let wait = deadline.saturating_duration_since(Instant::now());
            let outcome = match w.results.recv_timeout(wait) {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "did not rejoin the group in time".into(),
            };
            first_error.get_or_insert(EngineError::GroupFailed {
                rank: Some(w.rank),
                message: outcome,
            });
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        // The ranks dropped their graphs with the old communicator.
        #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
        self.rerecord_decode_graphs()?;
        Ok(())
    }

    /// Whether a device or collective failure has ended this engine.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Embedding sequences' chunks pool their hidden states instead of sampling: their
    /// sample rows leave the batch and their spans join `batch.pool`. Returns each
    /// span's sequence and first position, in order.
    fn pool_rows(&self, chunks: &[&ScheduledChunk], batch: &mut Batch) -> Vec<(SeqId, usize)> {
        let kind = |id: &SeqId| {
            self.sequences
                .get(id)
                .and_then(|s| s.pool.as_ref().map(PoolState::kind))
        };
        if !chunks.iter().any(|c| kind(&c.id).is_some()) {
            return Vec::new();
        }
        let mut spans = Vec::new();
        batch.sample_rows.clear();
        for (chunk, seq) in chunks.iter().zip(&batch.seqs) {
            match kind(&chunk.id) {
                Some(kind) => {
                    batch.pool.push(PoolSpan {
                        token_start: seq.token_start,
                        num_tokens: seq.num_tokens,
                        start_pos: seq.start_pos,
                        kind,
                    });
                    spans.push((chunk.id, seq.start_pos));
                }
                None if chunk.sample => batch.sample_rows.extend(
                    seq.token_start + seq.num_tokens - 1 - chunk.num_draft
                        ..seq.token_start + seq.num_tokens,
                ),
                None => {}
            }
        }
        spans
    }

    /// Adds each pooled span's part to its sequence's embedding.
    fn add_pooled(&mut self, spans: &[(SeqId, usize)], parts: Vec<Pooled>) -> Result<()> {
        if parts.len() != spans.len() {
            return Err(EngineError::Step(format!(
                "{} of {} embedding chunks came back pooled",
                parts.len(),
                spans.len()
            )));
        }
        for ((id, start_pos), part) in spans.iter().zip(parts) {
            if let Some(pool) = self.sequences.get_mut(id).and_then(|s| s.pool.as_mut()) {
                pool.add(*start_pos, part);
            }
        }
        Ok(())
    }

    fn run_step(&mut self, plan: &StepPlan) -> Result<StepOutput> {
        for id in &plan.finished {
            self.sequences.remove(id);
        }
        if let Some(mtp) = &mut self.mtp {
            mtp.track(plan);
        }
        // A sequence that cannot start fails alone; the rest of the step runs.
        let mut failed = Vec::new();
        for new in &plan.new_sequences {
            let mut sampler = Sampler::new(new.sampling.clone(), &new.prompt_ids);
            if new.sampling.constraint.is_some() {
                // Compiled once per request, off this thread, before submission.
                match start_constraint(new.sampling.prepared_constraint.as_ref()) {
                    Ok(constraint) => sampler = sampler.with_constraint(constraint),
                    Err(message) => {
                        tracing::warn!("{}: {message}; the sequence fails alone", new.id);
                        failed.push(FailedSequence {
                            id: new.id,
                            message,
                            by_request: false,
                        });
                        continue;
                    }
                }
            }
            let prompt = new
                .sampling
                .prompt_logprobs
                .map(|top| PromptLogprobs::new(&new.prompt_ids, top));
            let pool = new.sampling.pooling.map(PoolState::new);
            self.sequences.insert(
                new.id,
                SeqState {
                    sampler,
                    prompt,
                    pool,
                },
            );
        }
        // A chunk that cannot run fails its own sequence; the rest of the step runs.
        let limits = ChunkLimits {
            kv: self.kv,
            max_positions: self.config.max_position_embeddings,
            vocab_rows: self.config.vocab_size,
        };
        let mut runnable = Vec::with_capacity(plan.scheduled.len());
        for chunk in &plan.scheduled {
            if failed.iter().any(|f: &FailedSequence| f.id == chunk.id) {
                continue;
            }
            let refusal = match self.sequences.get(&chunk.id) {
                None => Err(format!("{} was never announced", chunk.id)),
                Some(_) => limits.check(chunk),
            };
            match refusal {
                Ok(()) => runnable.push(chunk),
                Err(message) => {
                    tracing::warn!("{message}; the sequence fails alone");
                    self.sequences.remove(&chunk.id);
                    failed.push(FailedSequence {
                        id: chunk.id,
                        message,
                        by_request: false,
                    });
                }
            }
        }
        if runnable.is_empty() {
            return Ok(StepOutput {
                samples: Vec::new(),
                failed,
                draft: None,
            });
        }
        let mut batch = Batch::from_chunks(runnable.iter().copied(), &limits)?;
        let unknown = |id: SeqId| EngineError::Step(format!("{id} was never announced"));
        let pooled = |id: &SeqId| self.sequences.get(id).is_some_and(|s| s.pool.is_some());
        let pool_chunks = self.pool_rows(&runnable, &mut batch);
        batch.row_reduce = Vec::with_capacity(batch.sample_rows.len());
        for c in runnable.iter().filter(|c| c.sample && !pooled(&c.id)) {
            let state = self.sequences.get(&c.id).ok_or_else(|| unknown(c.id))?;
            let reduction = state.sampler.reduction();
            batch
                .row_reduce
                .extend(std::iter::repeat_n(reduction, c.num_draft + 1));
        }
        // Rows scoring prompt tokens, after the sampled ones: whole rows.
        let mut prompt_rows = Vec::new();
        for (chunk, seq) in runnable.iter().zip(&batch.seqs) {
            let Some(p) = self
                .sequences
                .get(&chunk.id)
                .and_then(|s| s.prompt.as_ref())
            else {
                continue;
            };
            for (offset, pos) in p.wanted(chunk) {
                batch.sample_rows.push(seq.token_start + offset);
                batch.row_reduce.push(RowReduce::Logits);
                prompt_rows.push((chunk.id, pos));
            }
        }
        let token_starts: Vec<usize> = batch.seqs.iter().map(|s| s.token_start).collect();
        let mut logits = self.forward_rows(batch)?;
        self.add_pooled(&pool_chunks, std::mem::take(&mut logits.pooled))?;
        let vocab = self.config.vocab_size;
        let mut rows = logits.values.chunks_exact_mut(vocab.max(1));
        let mut samples = Vec::new();
        let sampled = runnable.iter().filter(|c| c.sample);
        let mut row = 0;
        for chunk in sampled {
            let state = self
                .sequences
                .get_mut(&chunk.id)
                .ok_or_else(|| unknown(chunk.id))?;
            if let Some(pool) = &state.pool {
                match pool.finish() {
                    Some(embedding) => samples.push(SampledToken {
                        id: chunk.id,
                        token: 0,
                        logprobs: None,
                        prompt_logprobs: None,
                        embedding: Some(embedding),
                        accepted: Vec::new(),
                        proposed: Vec::new(),
                    }),
                    None => {
                        self.sequences.remove(&chunk.id);
                        failed.push(FailedSequence {
                            id: chunk.id,
                            message: "the prompt's hidden states were not all pooled".into(),
                            by_request: false,
                        });
                    }
                }
                continue;
            }
            // A row after the last token and one after each guess, every one taken so
            // the step's later rows stay in place.
            let mut chunk_rows = Vec::with_capacity(chunk.num_draft + 1);
            for _ in 0..=chunk.num_draft {
                chunk_rows.push(match logits.reduced.get(row).cloned().flatten() {
                    Some(reduced) => Row::Reduced(reduced),
                    None => Row::Logits(rows.next().ok_or_else(|| {
                        EngineError::Step("fewer logit rows than samples".into())
                    })?),
                });
                row += 1;
            }
            let drafts = &chunk.tokens[chunk.tokens.len() - chunk.num_draft..];
            let mut emitted = sample_rows(&mut state.sampler, chunk_rows, drafts).into_iter();
            if let Some(fault) = state.sampler.grammar_fault() {
                // The sequence fails alone, with the reason; the rest of the step goes on.
                let (message, by_request) = (fault.message.clone(), fault.by_request);
                self.sequences.remove(&chunk.id);
                failed.push(FailedSequence {
                    id: chunk.id,
                    message,
                    by_request,
                });
                continue;
            }
            let (token, logprobs) = emitted
                .next()
                .ok_or_else(|| EngineError::Step("a chunk's first row gave no token".into()))?;
            samples.push(SampledToken {
                id: chunk.id,
                token,
                logprobs,
                prompt_logprobs: None,
                embedding: None,
                accepted: emitted.collect(),
                proposed: Vec::new(),
            });
        }
        for (id, pos) in prompt_rows {
            let row = rows
                .next()
                .ok_or_else(|| EngineError::Step("fewer logit rows than prompt rows".into()))?;
            if let Some(p) = self.sequences.get_mut(&id).and_then(|s| s.prompt.as_mut()) {
                p.record(pos, row);
            }
        }
        // A sequence's first token carries its prompt's log-probabilities.
        let mut incomplete = Vec::new();
        for s in &mut samples {
            let prompt = self
                .sequences
                .get_mut(&s.id)
                .and_then(|st| st.prompt.as_mut());
            match prompt.and_then(PromptLogprobs::take) {
                Some(Ok(lp)) => s.prompt_logprobs = Some(lp),
                Some(Err(message)) => incomplete.push(FailedSequence {
                    id: s.id,
                    message,
                    by_request: false,
                }),
                None => {}
            }
        }
        for f in &incomplete {
            self.sequences.remove(&f.id);
        }
        samples.retain(|s| !incomplete.iter().any(|f| f.id == s.id));
        failed.extend(incomplete);
        let draft = match self.mtp.is_some() {
            true => {
                let chunks: Vec<_> = runnable.iter().copied().zip(token_starts).collect();
                self.mtp_guesses(&chunks, &mut samples, &limits)?
            }
            false => None,
        };
        Ok(StepOutput {
            samples,
            failed,
            draft,
        })
    }
}

impl Executor for Engine {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        self.run_step(plan).map_err(|e| {
            let group = e.fails_group() || self.failed.is_some();
            let (rank, message) = match e {
                EngineError::Rank { rank, message } => (Some(rank), message),
                EngineError::GroupFailed { rank, message } => (rank, message),
                other => (None, other.to_string()),
            };
            if group {
                ExecutorError::group(rank, message)
            } else {
                ExecutorError::step(rank, message)
            }
        })
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        self.kv
    }

    fn max_context_tokens(&self) -> usize {
        self.config.max_position_embeddings
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for w in &mut self.workers {
            // Closing the job channel ends the worker's loop.
            let (dead_tx, _) = crossbeam_channel::unbounded();
            drop(std::mem::replace(&mut w.jobs, dead_tx));
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                if self.failed.is_some() {
                    // A hung rank may never return; do not block shutdown on it.
                    continue;
                }
                let _ = t.join();
            }
        }
    }
}
