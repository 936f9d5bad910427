//! Generation of one sequence straight on an [`Executor`], without the scheduler: the
//! blocks of the sequence are simply `0, 1, 2, ...`. Used by `tessera generate` and by
//! the reference tests.

use tessera_protocol::{
    Executor, ExecutorError, NewSequence, SampledToken, SamplingParams, ScheduledChunk, SeqId,
    StepPlan,
};

/// Options of [`generate`].
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops after any of these tokens (which is included in the output).
    pub stop_token_ids: Vec<u32>,
    /// Prompt tokens per forward pass (chunked prefill); 0 = the whole prompt at once.
    pub prefill_chunk: usize,
}

/// Generates up to `max_tokens` after `prompt`; calls `on_token` for each token.
pub fn generate(
    exec: &mut dyn Executor,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>, ExecutorError> {
    generate_sampled(exec, prompt, opts, |s| on_token(s.token))
}

/// As [`generate`], handing `on_sample` each sampled token with its log-probabilities
/// (when `opts.sampling.logprobs` asks for them).
pub fn generate_sampled(
    exec: &mut dyn Executor,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_sample: impl FnMut(&SampledToken),
) -> Result<Vec<u32>, ExecutorError> {
    let fail = |m: String| ExecutorError::step(None, m);
    if prompt.is_empty() {
        return Err(fail("empty prompt".into()));
    }
    let shape = exec.kv_cache_shape();
    let total = prompt.len() + opts.max_tokens;
    // Every KV group of the sequence holds every block (nothing is released here).
    let per_group = total.div_ceil(shape.block_size_tokens);
    if total > exec.max_context_tokens() || per_group * shape.num_groups() > shape.num_blocks {
        return Err(fail(format!(
            "prompt ({}) + max tokens ({}) exceeds the context ({}) or the KV cache ({} tokens)",
            prompt.len(),
            opts.max_tokens,
            exec.max_context_tokens(),
            shape.capacity_tokens() / shape.num_groups()
        )));
    }
    let id = SeqId(0);
    let table = |g: usize| {
        (g * per_group..(g + 1) * per_group)
            .map(|b| b as u32)
            .collect()
    };
    let blocks: Vec<u32> = table(0);
    let group_tables: Vec<Vec<u32>> = (1..shape.num_groups()).map(table).collect();
    let mut new_sequences = vec![NewSequence {
        id,
        sampling: opts.sampling.clone(),
        prompt_ids: prompt.to_vec(),
    }];
    let chunk = if opts.prefill_chunk == 0 {
        prompt.len()
    } else {
        opts.prefill_chunk
    };
    let mut pos = 0;
    let mut pending: Vec<u32> = Vec::new();
    let mut out = Vec::new();
    while out.len() < opts.max_tokens {
        let tokens = if pos < prompt.len() {
            prompt[pos..(pos + chunk).min(prompt.len())].to_vec()
        } else {
            std::mem::take(&mut pending)
        };
        let sample = pos + tokens.len() >= prompt.len();
        let plan = StepPlan {
            new_sequences: std::mem::take(&mut new_sequences),
            scheduled: vec![ScheduledChunk {
                id,
                tokens: tokens.clone(),
                start_pos: pos,
                block_table: blocks.clone(),
                sample,
                num_draft: 0,
                propose: 0,
                group_tables: group_tables.clone(),
            }],
            finished: vec![],
        };
        let output = exec.step(&plan)?;
        if let Some(refused) = output.failed.first() {
            return Err(fail(refused.message.clone()));
        }
        pos += tokens.len();
        if let Some(s) = output.samples.first() {
            out.push(s.token);
            on_sample(s);
            if opts.stop_token_ids.contains(&s.token) {
                break;
            }
            pending = vec![s.token];
        }
    }
    exec.step(&StepPlan {
        finished: vec![id],
        ..StepPlan::default()
    })?;
    Ok(out)
}
