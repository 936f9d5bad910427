//! Speculative decoding with a draft model (`--speculative-config '{"method":
//! "draft_model", ...}'`): a smaller model with the target's tokenizer guesses the
//! tokens after each sequence's latest sample, and the target scores them in its next
//! step.
//!
//! [`Drafted`] is the executor the scheduler drives: each step runs the target, then
//! the draft. The draft shares the target's block tables (its own cache has as many
//! blocks, so a block id means the same positions in both). It runs every prefill chunk
//! of a sequence it drafts for; where a chunk asks for guesses
//! ([`ScheduledChunk::propose`]) it first runs, in one pass, the tokens the sequence
//! gained since it last ran, then one more token at a time, greedily, writing its KV at
//! the positions the scheduler reserved ahead. Guesses that the target keeps leave the
//! draft's KV at their positions valid; a rejected one is overwritten when the draft
//! next runs that position. The time its passes take goes back with the step
//! ([`StepOutput::draft`]): the scheduler weighs a guess by it.
//!
//! The draft runs on the first device only, whatever the target's tensor parallelism:
//! it is small, a step of it is a few short forward passes, and splitting it would add
//! a collective per layer to each of them for little compute saved.
//!
//! Greedy guesses are a function of the context, so the target keeping a guess exactly
//! when its own sample equals it (what it does for every guess) preserves its output
//! distribution under any sampling; see `tessera_scheduler::speculation`.

mod load;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use tessera_protocol::{
    DraftTime, Executor, ExecutorError, KvCacheShape, NewSequence, SamplingParams, ScheduledChunk,
    SeqId, StepOutput, StepPlan,
};

pub use load::load_drafted;

/// Tokens a sequence's draft KV may fall behind while no guesses are asked for: the most
/// a catch-up pass then runs beside the guessing ones.
const MAX_DRAFT_LAG: usize = 256;

/// A target executor with a draft model's guesses.
pub struct Drafted<T, D> {
    target: T,
    draft: D,
    /// Token ids at or above this are not the target's: a guess there ends the guesses.
    vocab_rows: usize,
    seqs: HashMap<SeqId, DraftSeq>,
    /// Sequences the draft knows and the target is done with: the draft's next plan
    /// drops them.
    finished: Vec<SeqId>,
}

/// What the draft knows of one sequence.
#[derive(Debug)]
struct DraftSeq {
    /// The sequence's tokens so far (prompt, then every token the target emitted).
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Positions whose draft KV holds the sequence's own tokens.
    computed: usize,
    /// Guesses run through the draft at positions `computed..`, valid as far as the
    /// sequence turns out to continue with them.
    fed: Vec<u32>,
    /// The draft holds state for it (it was in a draft plan's `new_sequences`).
    announced: bool,
    /// Tokens in the target's KV after the latest chunk; `None` before the first. A
    /// chunk starting before it recomputes (the sequence was preempted).
    target_computed: Option<usize>,
}

/// A sequence's part of one draft step.
struct Guessing {
    id: SeqId,
    /// Index of its sample in the target's output.
    sample: usize,
    block_table: Vec<u32>,
    wanted: usize,
    guesses: Vec<u32>,
}

impl<T: Executor, D: Executor> Drafted<T, D> {
    /// `vocab_rows`: the target's vocabulary (rows of its LM head).
    pub fn new(target: T, draft: D, vocab_rows: usize) -> Self {
        Self {
            target,
            draft,
            vocab_rows,
            seqs: HashMap::new(),
            finished: Vec::new(),
        }
    }

    /// The model whose tokens are served.
    pub fn target(&self) -> &T {
        &self.target
    }

    pub fn target_mut(&mut self) -> &mut T {
        &mut self.target
    }

    /// Learn the plan's new and finished sequences.
    fn track(&mut self, plan: &StepPlan) {
        for id in &plan.finished {
            if self.seqs.remove(id).is_some_and(|s| s.announced) {
                self.finished.push(*id);
            }
        }
        for s in &plan.new_sequences {
            // Embeddings and prompt scoring never decode.
            if s.sampling.pooling.is_some() || s.sampling.prompt_logprobs.is_some() {
                continue;
            }
            self.seqs.insert(
                s.id,
                DraftSeq {
                    tokens: s.prompt_ids.clone(),
                    prompt_len: s.prompt_ids.len(),
                    computed: 0,
                    fed: Vec::new(),
                    announced: false,
                    target_computed: None,
                },
            );
        }
    }

    /// The draft's first step for this target step: every drafted sequence's tokens the
    /// draft has not run, sampling where guesses are wanted.
    fn first_draft_plan(&mut self, plan: &StepPlan, out: &StepOutput) -> (StepPlan, Vec<Guessing>) {
        let failed: HashSet<SeqId> = out.failed.iter().map(|f| f.id).collect();
        let mut draft_plan = StepPlan {
            finished: std::mem::take(&mut self.finished),
            ..StepPlan::default()
        };
        let mut guessing = Vec::new();
        let mut next_sample = 0;
        for chunk in &plan.scheduled {
            let sample = (chunk.sample && !failed.contains(&chunk.id)).then(|| {
                next_sample += 1;
                next_sample - 1
            });
            let Some(seq) = self.seqs.get_mut(&chunk.id) else {
                continue;
            };
            if failed.contains(&chunk.id) {
                // The scheduler ends it; the draft forgets it with the target.
                continue;
            }
            // Its first chunk starts where the target's KV ends: after a prefix-cache hit
            // the blocks shared were written by sequences the draft also ran. A chunk
            // starting before the target's KV ended recomputes (after preemption), and
            // so does the draft.
            match seq.target_computed {
                None => seq.computed = chunk.start_pos,
                Some(t) if chunk.start_pos < t => {
                    seq.computed = seq.computed.min(chunk.start_pos);
                    seq.fed.clear();
                }
                Some(_) => {}
            }
            let sampled = sample.and_then(|i| out.samples.get(i));
            let accepted = sampled.map_or(0, |s| s.accepted.len());
            seq.target_computed = Some(chunk.end_pos() - chunk.num_draft + accepted);
            let end = match sampled {
                Some(s) => {
                    seq.tokens.push(s.token);
                    seq.tokens.extend(s.accepted.iter().map(|(t, _)| *t));
                    let kept = seq
                        .fed
                        .iter()
                        .zip(seq.tokens.get(seq.computed..).unwrap_or_default())
                        .take_while(|(a, b)| a == b)
                        .count();
                    seq.computed += kept;
                    seq.fed.clear();
                    // The last token sampled has no KV in the target either, unless the
                    // draft runs it to guess after it. Without guesses wanted the draft
                    // waits, and runs what it missed in one pass when they are (a step
                    // that does not guess then costs nothing here), unless it fell
                    // `MAX_DRAFT_LAG` behind.
                    match chunk.propose {
                        0 if seq.tokens.len() - 1 < seq.computed + MAX_DRAFT_LAG => continue,
                        0 => seq.tokens.len() - 1,
                        _ => seq.tokens.len(),
                    }
                }
                None => chunk.end_pos().min(seq.tokens.len()),
            };
            if end <= seq.computed {
                continue;
            }
            if !seq.announced {
                seq.announced = true;
                draft_plan.new_sequences.push(NewSequence {
                    id: chunk.id,
                    // The draft's sampling: its most likely token.
                    sampling: SamplingParams::greedy(),
                    prompt_ids: seq.tokens[..seq.prompt_len].to_vec(),
                });
            }
            let wants = chunk.propose > 0 && sample.is_some();
            draft_plan.scheduled.push(ScheduledChunk {
                id: chunk.id,
                tokens: seq.tokens[seq.computed..end].to_vec(),
                start_pos: seq.computed,
                block_table: chunk.block_table.clone(),
                sample: wants,
                num_draft: 0,
                propose: 0,
                group_tables: Vec::new(),
            });
            seq.computed = end;
            if let (true, Some(i)) = (wants, sample) {
                guessing.push(Guessing {
                    id: chunk.id,
                    sample: i,
                    block_table: chunk.block_table.clone(),
                    wanted: chunk.propose,
                    guesses: Vec::new(),
                });
            }
        }
        (draft_plan, guessing)
    }

    /// Run the draft for this step; the guesses go into `out`.
    fn guess(&mut self, plan: &StepPlan, out: &mut StepOutput) -> Result<(), ExecutorError> {
        let (mut draft_plan, mut guessing) = self.first_draft_plan(plan, out);
        let started = Instant::now();
        let mut passes = 0;
        loop {
            if draft_plan.scheduled.is_empty() && draft_plan.finished.is_empty() {
                break;
            }
            passes += usize::from(draft_plan.scheduled.iter().any(|c| c.sample));
            let draft_out = self.draft.step(&draft_plan)?;
            for f in &draft_out.failed {
                // The draft cannot run it (its own limits): it guesses no more for it.
                tracing::debug!(seq = %f.id, "draft model dropped a sequence: {}", f.message);
                if self.seqs.remove(&f.id).is_some() {
                    self.finished.push(f.id);
                }
                guessing.retain(|g| g.id != f.id);
            }
            for s in &draft_out.samples {
                if let Some(g) = guessing.iter_mut().find(|g| g.id == s.id) {
                    if s.token as usize >= self.vocab_rows {
                        // Not a token of the target: no guess at or after it.
                        g.wanted = g.guesses.len();
                    } else {
                        g.guesses.push(s.token);
                    }
                }
            }
            guessing.retain(|g| {
                let done = g.guesses.len() >= g.wanted || g.guesses.is_empty();
                if done {
                    if let Some(sample) = out.samples.get_mut(g.sample) {
                        sample.proposed = g.guesses.clone();
                    }
                }
                !done
            });
            draft_plan = StepPlan::default();
            for g in &guessing {
                let Some(seq) = self.seqs.get_mut(&g.id) else {
                    continue;
                };
                let Some(&last) = g.guesses.last() else {
                    continue;
                };
                // The guess at position `computed + fed.len()` goes in to guess the next.
                draft_plan.scheduled.push(ScheduledChunk {
                    id: g.id,
                    tokens: vec![last],
                    start_pos: seq.computed + seq.fed.len(),
                    block_table: g.block_table.clone(),
                    sample: true,
                    num_draft: 0,
                    propose: 0,
                    group_tables: Vec::new(),
                });
                seq.fed.push(last);
            }
        }
        out.draft = Some(DraftTime {
            passes,
            seconds: started.elapsed().as_secs_f64(),
        });
        Ok(())
    }
}

impl<T: Executor, D: Executor> Executor for Drafted<T, D> {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        let mut out = self.target.step(plan)?;
        self.track(plan);
        self.guess(plan, &mut out)?;
        Ok(out)
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        self.target.kv_cache_shape()
    }

    fn max_context_tokens(&self) -> usize {
        self.target
            .max_context_tokens()
            .min(self.draft.max_context_tokens())
    }
}
