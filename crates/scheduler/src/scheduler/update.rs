//! Applying a step's output: samples appended, stops checked, events sent, and the
//! sequences that ended listed for the next plan.

use std::collections::HashMap;
use std::mem;

use tessera_protocol::{FinishReason, SeqId, StepOutput, TokenEvent};

use super::Scheduler;
use crate::error::SchedulerError;
use crate::speculation::check_accepted;

impl Scheduler {
    /// Apply the executor's output for the plan in flight: append samples, check stops,
    /// send events, and end finished sequences (their ids go into the next plan).
    pub fn update(&mut self, output: &StepOutput) -> Result<(), SchedulerError> {
        self.step_cost
            .took(self.counters.last_step_duration, output.draft.as_ref());
        let chunks = mem::take(&mut self.in_flight);
        let failed: HashMap<SeqId, (&str, bool)> = output
            .failed
            .iter()
            .map(|f| (f.id, (f.message.as_str(), f.by_request)))
            .collect();
        if let Some(stray) = failed
            .keys()
            .find(|id| !chunks.iter().any(|(c, _)| c == *id))
        {
            return Err(SchedulerError::OutputMismatch(format!(
                "{stray} reported failed but was not in the step"
            )));
        }
        let sampled = |(id, sample): &&(SeqId, bool)| *sample && !failed.contains_key(id);
        let expected = chunks.iter().filter(sampled).map(|(id, _)| *id);
        if !expected.eq(output.samples.iter().map(|s| s.id)) {
            let want: Vec<_> = chunks.iter().filter(sampled).map(|(id, _)| id).collect();
            let got: Vec<_> = output.samples.iter().map(|s| s.id).collect();
            return Err(SchedulerError::OutputMismatch(format!(
                "expected samples for {want:?}, got {got:?}"
            )));
        }
        // A sequence that failed alone ends here; its blocks hold nothing anyone shares
        // (only full, committed blocks are shared, and a step writes past them).
        for (id, (message, by_request)) in failed {
            let event = match by_request {
                true => {
                    tracing::info!(seq = %id, "sequence refused: {message}");
                    TokenEvent::Refused(message.to_string())
                }
                false => {
                    tracing::warn!(seq = %id, "sequence failed: {message}");
                    TokenEvent::Failed(message.to_string())
                }
            };
            self.end_with(id, event);
        }
        // The step succeeded: the KV of every other scheduled chunk now exists and its
        // full blocks may be shared. Then the blocks that every layer's window has left
        // behind go back to the pool.
        for (id, _) in &chunks {
            if let Some(seq) = self.seqs.get(id) {
                self.kv
                    .commit_computed(*id, &seq.tokens, seq.num_computed_tokens);
                self.kv.release_behind_window(*id, seq.num_computed_tokens);
            }
        }
        let mut drafts_in_flight = mem::take(&mut self.drafts_in_flight);
        for sample in &output.samples {
            let proposal = drafts_in_flight.remove(&sample.id).unwrap_or_default();
            let drafts = &proposal.tokens;
            check_accepted(sample, drafts)?;
            let Some(seq) = self.seqs.get_mut(&sample.id) else {
                return Err(SchedulerError::UnknownSequence(sample.id));
            };
            if let Some(embedding) = &sample.embedding {
                // An embedding sequence ends with its prompt: nothing is generated.
                let delivered = seq.send(TokenEvent::Embedding(embedding.clone()));
                self.finish(sample.id, delivered.then_some(FinishReason::Stop));
                continue;
            }
            if !drafts.is_empty() {
                self.counters
                    .speculation
                    .record(drafts.len(), sample.accepted.len());
                seq.guesses
                    .record(proposal.match_len, drafts.len(), sample.accepted.len());
            }
            // The sampled token, then one per accepted guess; each accepted guess's KV
            // (written in this step) now holds a token of the sequence. A stop ends the
            // sequence where it happens, and what came after it is dropped.
            let first = (
                sample.token,
                sample.logprobs.clone(),
                sample.prompt_logprobs.clone(),
            );
            let rest = sample.accepted.iter().map(|(t, lp)| (*t, lp.clone(), None));
            for (i, (token, logprobs, prompt_logprobs)) in
                std::iter::once(first).chain(rest).enumerate()
            {
                if i > 0 {
                    seq.num_computed_tokens += 1;
                }
                seq.tokens.push(token);
                self.counters.generation_tokens += 1;
                let delivered = seq.send(TokenEvent::Token {
                    token,
                    logprobs,
                    prompt_logprobs,
                });
                if !delivered {
                    self.finish(sample.id, None);
                    break;
                }
                if let Some(reason) = seq.stop_reason(self.cfg.max_model_len) {
                    self.finish(sample.id, Some(reason));
                    break;
                }
            }
            if let Some(seq) = self.seqs.get_mut(&sample.id) {
                seq.drafted.clone_from(&sample.proposed);
                seq.guessed_after = seq.tokens.len();
            }
        }
        self.counters.steps += 1;
        Ok(())
    }
}
