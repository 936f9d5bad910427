//! `mtp` speculation: after each step the model's own multi-token-prediction layer
//! (`crate::model::decoder` `mtp`) guesses the tokens after each sequence's latest sample,
//! and the scheduler has the model score them in its next step, as a draft model's.
//!
//! Each step, one pass of the layer runs over every position the step settled (its
//! chunk's tokens and the guesses the model kept, not those it rejected), each with the
//! token after it and the model's hidden state there, so the layer's KV always covers the
//! sequence's settled positions. Where the step asked a sequence for guesses
//! ([`ScheduledChunk::propose`]) the pass samples its last position, whose token is the
//! step's new sample: its most likely token is the first guess. Each further guess is one
//! more pass over that guess alone, with the layer's own output at the position before
//! in place of the model's hidden state, writing the layer's KV ahead at positions the
//! scheduler reserved; the next step rewrites the ones it does not keep.
//!
//! Every sequence that decodes takes part in the first pass, asked for guesses or not: a
//! position the layer skipped would leave its KV stale for later guesses. The pass is
//! one layer over the step's tokens (on GLM-4.5, about 1/93 of the step) and counts as
//! the step's own time; the further passes are what the scheduler weighs a guess by
//! ([`DraftTime`]). The layer's KV in blocks shared through the prefix cache was written
//! by the sequence that filled them; its last position reads the token after it in that
//! sequence, so a sequence going on differently may guess a little worse there, never
//! emit differently.
//!
//! The guesses are the layer's arg-max, a function of the context: keeping a guess
//! exactly when the model's own sample equals it keeps the output distribution under any
//! sampling (see `verify`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tessera_protocol::{DraftTime, SampledToken, ScheduledChunk, SeqId, StepPlan};

use super::Engine;
use crate::error::{EngineError, Result};
use crate::model::batch::RowReduce;
use crate::model::{Batch, ChunkLimits};
use crate::worker::{Job, MtpHidden, MtpJob, Reduced, StepLogits};

/// The tokens of each sequence the MTP layer runs for.
#[derive(Debug, Default)]
pub(crate) struct MtpSeqs {
    /// Per sequence, its tokens as far as the engine has seen them (prompt, then each
    /// token it emitted), by position.
    tokens: HashMap<SeqId, Vec<u32>>,
}

impl MtpSeqs {
    /// Learns the plan's new and finished sequences. Embeddings and prompt scoring never
    /// decode: the layer does not run for them.
    pub(super) fn track(&mut self, plan: &StepPlan) {
        for id in &plan.finished {
            self.tokens.remove(id);
        }
        for s in &plan.new_sequences {
            if s.sampling.pooling.is_none() && s.sampling.prompt_logprobs.is_none() {
                self.tokens.insert(s.id, s.prompt_ids.clone());
            }
        }
    }
}

/// `tokens` written into `known` from position `start` on.
fn write_at(known: &mut Vec<u32>, start: usize, tokens: &[u32]) {
    for (i, &t) in tokens.iter().enumerate() {
        let pos = start + i;
        if pos < known.len() {
            known[pos] = t;
        } else if pos == known.len() {
            known.push(t);
        } else {
            // A gap: nothing is known past it.
            return;
        }
    }
}

/// A sequence the MTP layer is guessing for in this step.
struct Guessing {
    id: SeqId,
    /// Its chunk's block tables (group 0's, then the others').
    block_table: Vec<u32>,
    group_tables: Vec<Vec<u32>>,
    wanted: usize,
    guesses: Vec<u32>,
    /// The position its next pass writes.
    next_pos: usize,
}

impl Engine {
    /// Runs the MTP layer after a step whose `chunks` (each with its first row in the
    /// step's batch) gave `samples`; the guesses go into the samples.
    pub(super) fn mtp_guesses(
        &mut self,
        chunks: &[(&ScheduledChunk, usize)],
        samples: &mut [SampledToken],
        limits: &ChunkLimits,
    ) -> Result<Option<DraftTime>> {
        let Some(mut seqs) = self.mtp.take() else {
            return Ok(None);
        };
        let out = self.mtp_passes(&mut seqs, chunks, samples, limits);
        self.mtp = Some(seqs);
        out.map(Some)
    }

    /// The first pass, then one per further guess. What the guesses cost beyond the step
    /// is the further passes: the first runs every step (it keeps the layer's KV
    /// whole), guessing or not, so it counts as the step's own time.
    fn mtp_passes(
        &mut self,
        seqs: &mut MtpSeqs,
        chunks: &[(&ScheduledChunk, usize)],
        samples: &mut [SampledToken],
        limits: &ChunkLimits,
    ) -> Result<DraftTime> {
        let mut pass = Vec::new();
        let mut rows = Vec::new();
        let mut guessing = Vec::new();
        for (chunk, token_start) in chunks {
            let Some(known) = seqs.tokens.get_mut(&chunk.id) else {
                continue;
            };
            let real = chunk.tokens.len() - chunk.num_draft;
            write_at(known, chunk.start_pos, &chunk.tokens[..real]);
            let sample = samples.iter().find(|s| s.id == chunk.id);
            // Positions whose model KV the step settled: the chunk's own tokens, and the
            // guesses kept (every emitted token but the last equals one).
            let settled = match (sample, chunk.sample) {
                (Some(s), _) => {
                    let emitted: Vec<u32> = std::iter::once(s.token)
                        .chain(s.accepted.iter().map(|(t, _)| *t))
                        .collect();
                    write_at(known, chunk.start_pos + real, &emitted);
                    real + emitted.len() - 1
                }
                // The sequence failed in this step.
                (None, true) => continue,
                (None, false) => real,
            };
            // Each position with the token after it, where that is known (the last of a
            // prompt chunk reads the prompt's next token).
            let count = settled.min(known.len().saturating_sub(chunk.start_pos + 1));
            if count == 0 {
                continue;
            }
            let wants = sample.is_some() && chunk.propose > 0 && count == settled;
            let mtp_chunk = ScheduledChunk {
                id: chunk.id,
                tokens: known[chunk.start_pos + 1..chunk.start_pos + 1 + count].to_vec(),
                start_pos: chunk.start_pos,
                block_table: chunk.block_table.clone(),
                sample: wants,
                num_draft: 0,
                propose: 0,
                group_tables: chunk.group_tables.clone(),
            };
            if let Err(why) = limits.check(&mtp_chunk) {
                tracing::debug!("the MTP layer skips {}: {why}", chunk.id);
                continue;
            }
            rows.extend((*token_start..token_start + count).map(|r| r as u32));
            if wants {
                guessing.push(Guessing {
                    id: chunk.id,
                    block_table: chunk.block_table.clone(),
                    group_tables: chunk.group_tables.clone(),
                    wanted: chunk.propose,
                    guesses: Vec::new(),
                    next_pos: chunk.start_pos + count,
                });
            }
            pass.push(mtp_chunk);
        }
        let mut further = DraftTime {
            passes: 0,
            seconds: 0.0,
        };
        if pass.is_empty() {
            return Ok(further);
        }
        let mut hidden = MtpHidden::Model;
        loop {
            let started = Instant::now();
            let tokens = self.mtp_pass(&pass, hidden, rows, limits)?;
            if hidden == MtpHidden::Chain {
                further.passes += 1;
                further.seconds += started.elapsed().as_secs_f64();
            }
            if tokens.len() != guessing.len() {
                return Err(EngineError::Step(format!(
                    "the MTP layer gave {} guesses for {} sequences",
                    tokens.len(),
                    guessing.len()
                )));
            }
            for (g, t) in guessing.iter_mut().zip(tokens) {
                g.guesses.push(t);
            }
            // The next pass: each sequence that wants more, its latest guess at the next
            // position, where its blocks reach; its hidden state is its row among this
            // pass's sampled rows, which are in `guessing`'s order.
            (pass, rows) = (Vec::new(), Vec::new());
            let mut next = Vec::new();
            for (i, mut g) in std::mem::take(&mut guessing).into_iter().enumerate() {
                let chunk = ScheduledChunk {
                    id: g.id,
                    tokens: g.guesses.last().copied().into_iter().collect(),
                    start_pos: g.next_pos,
                    block_table: g.block_table.clone(),
                    sample: true,
                    num_draft: 0,
                    propose: 0,
                    group_tables: g.group_tables.clone(),
                };
                let more = g.guesses.len() < g.wanted && limits.check(&chunk).is_ok();
                if !more {
                    if let Some(s) = samples.iter_mut().find(|s| s.id == g.id) {
                        s.proposed = std::mem::take(&mut g.guesses);
                    }
                    continue;
                }
                rows.push(i as u32);
                g.next_pos += 1;
                pass.push(chunk);
                next.push(g);
            }
            guessing = next;
            if pass.is_empty() {
                return Ok(further);
            }
            hidden = MtpHidden::Chain;
        }
    }

    /// After the fp8 KV cache's calibration step over `chunks` (one sequence, from
    /// position 0), one pass of the MTP layer over the same positions, each with the
    /// step's next token, so that its slot's scales come from that step too.
    pub(super) fn mtp_calibration_pass(
        &mut self,
        chunks: &[ScheduledChunk],
        limits: &ChunkLimits,
    ) -> Result<()> {
        let mut pass = Vec::new();
        let mut rows = Vec::new();
        let mut first_row = 0u32;
        for c in chunks {
            let n = c.tokens.len();
            if n > 1 {
                pass.push(ScheduledChunk {
                    tokens: c.tokens[1..].to_vec(),
                    sample: false,
                    ..c.clone()
                });
                rows.extend(first_row..first_row + n as u32 - 1);
            }
            first_row += n as u32;
        }
        if !pass.is_empty() {
            self.mtp_pass(&pass, MtpHidden::Model, rows, limits)?;
        }
        Ok(())
    }

    /// One pass of the MTP layer over `chunks`, each row's hidden state from `hidden`'s
    /// row in `rows`; the arg-max of each sampled row, in order.
    fn mtp_pass(
        &mut self,
        chunks: &[ScheduledChunk],
        hidden: MtpHidden,
        rows: Vec<u32>,
        limits: &ChunkLimits,
    ) -> Result<Vec<u32>> {
        let mut batch = Batch::from_chunks(chunks, limits)?;
        batch.row_reduce = vec![RowReduce::Argmax; batch.sample_rows.len()];
        let sampled = batch.sample_rows.len();
        let job = Arc::new(MtpJob {
            batch,
            hidden,
            rows,
        });
        let logits = self
            .dispatch_job(|| Job::Mtp(job.clone()))?
            .ok_or_else(|| EngineError::Step("no rank returned the MTP layer's logits".into()))?;
        argmaxes(logits, sampled, self.config.vocab_size)
    }
}

/// The arg-max of each of `rows` sampled rows as the rank handed them back.
fn argmaxes(logits: StepLogits, rows: usize, vocab: usize) -> Result<Vec<u32>> {
    let mut full = logits.values.chunks_exact(vocab.max(1));
    (0..rows)
        .map(|r| match logits.reduced.get(r).cloned().flatten() {
            Some(Reduced::Token(t)) => Ok(t),
            Some(Reduced::Scored { argmax, .. }) => Ok(argmax),
            _ => {
                let row = full.next().ok_or_else(|| {
                    EngineError::Step("fewer MTP logit rows than sampled rows".into())
                })?;
                Ok(crate::sampler::argmax(row))
            }
        })
        .collect()
}
