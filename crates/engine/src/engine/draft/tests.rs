//! The draft's bookkeeping against executors whose "models" are rules over the context
//! they hold in their KV: a guess made from a stale or missing KV position differs from
//! the rule applied to the true context, so these tests see it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use tessera_protocol::{
    Executor, ExecutorError, KvCacheShape, NewSequence, SampledToken, SamplingParams,
    ScheduledChunk, SeqId, StepOutput, StepPlan,
};

use super::Drafted;

const VOCAB: u32 = 50;
const BLOCK: usize = 4;

/// The target's next token after `ctx`.
fn target_rule(ctx: &[u32]) -> u32 {
    let n = ctx.len();
    (ctx[n - 1] * 7 + ctx.get(n.wrapping_sub(2)).copied().unwrap_or(1) * 3 + 1) % VOCAB
}

/// The draft's: the target's, except after every fifth position.
fn draft_rule(ctx: &[u32]) -> u32 {
    match ctx.len() % 5 {
        0 => (target_rule(ctx) + 1) % VOCAB,
        _ => target_rule(ctx),
    }
}

/// A model that reads its context from the KV positions written so far.
struct RuleModel {
    rule: fn(&[u32]) -> u32,
    kv: HashMap<SeqId, Vec<Option<u32>>>,
    /// Tokens run, over all steps.
    tokens_run: usize,
}

impl RuleModel {
    fn new(rule: fn(&[u32]) -> u32) -> Self {
        Self {
            rule,
            kv: HashMap::new(),
            tokens_run: 0,
        }
    }
}

impl Executor for RuleModel {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        for id in &plan.finished {
            self.kv.remove(id);
        }
        for s in &plan.new_sequences {
            assert!(
                self.kv.insert(s.id, Vec::new()).is_none(),
                "announced twice"
            );
        }
        let mut samples = Vec::new();
        for c in &plan.scheduled {
            assert!(c.block_table.len() * BLOCK >= c.end_pos(), "{c:?}");
            let kv = self.kv.get_mut(&c.id).expect("announced");
            if kv.len() < c.end_pos() {
                kv.resize(c.end_pos(), None);
            }
            for (i, t) in c.tokens.iter().enumerate() {
                kv[c.start_pos + i] = Some(*t);
            }
            self.tokens_run += c.tokens.len();
            if !c.sample {
                continue;
            }
            let context = |end: usize| -> Vec<u32> {
                kv[..end]
                    .iter()
                    .map(|t| t.expect("a position before the sample has no KV"))
                    .collect()
            };
            let real_end = c.end_pos() - c.num_draft;
            let token = (self.rule)(&context(real_end));
            let mut accepted = Vec::new();
            let mut last = token;
            for (i, &d) in c.tokens[c.tokens.len() - c.num_draft..].iter().enumerate() {
                if d != last {
                    break;
                }
                last = (self.rule)(&context(real_end + i + 1));
                accepted.push((last, None));
            }
            samples.push(SampledToken {
                id: c.id,
                token,
                logprobs: None,
                prompt_logprobs: None,
                embedding: None,
                accepted,
                proposed: Vec::new(),
            });
        }
        Ok(StepOutput {
            samples,
            failed: Vec::new(),
            draft: None,
        })
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        KvCacheShape::new(1024, BLOCK)
    }

    fn max_context_tokens(&self) -> usize {
        4096
    }
}

/// The draft's guesses after `tokens`, `k` of them.
fn expected_guesses(tokens: &[u32], k: usize) -> Vec<u32> {
    let mut ctx = tokens.to_vec();
    let mut out = Vec::new();
    for _ in 0..k {
        let t = draft_rule(&ctx);
        out.push(t);
        ctx.push(t);
    }
    out
}

fn greedy_text(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    for _ in 0..n {
        ctx.push(target_rule(&ctx));
    }
    ctx
}

/// One sequence as the scheduler would drive it: the guesses proposed after each step
/// are scored in the next, with `k` more asked for; the table always covers them.
struct Driven {
    id: SeqId,
    tokens: Vec<u32>,
    computed: usize,
    guesses: Vec<u32>,
}

impl Driven {
    fn chunk(&self, k: usize, prefill_to: Option<usize>) -> ScheduledChunk {
        let end = prefill_to.unwrap_or(self.tokens.len());
        let sample = end == self.tokens.len();
        let guesses = if sample { self.guesses.clone() } else { vec![] };
        let mut tokens = self.tokens[self.computed..end].to_vec();
        tokens.extend(&guesses);
        let blocks = (end + guesses.len() + k).div_ceil(BLOCK) as u32;
        ScheduledChunk {
            id: self.id,
            tokens,
            start_pos: self.computed,
            block_table: (self.id.0 as u32 * 100..self.id.0 as u32 * 100 + blocks).collect(),
            sample,
            num_draft: guesses.len(),
            propose: if sample { k } else { 0 },
            group_tables: Vec::new(),
        }
    }

    fn take(&mut self, chunk: &ScheduledChunk, out: &StepOutput, k: usize) {
        if !chunk.sample {
            self.computed = chunk.end_pos();
            return;
        }
        let s = out.samples.iter().find(|s| s.id == self.id).unwrap();
        self.tokens.push(s.token);
        self.tokens.extend(s.accepted.iter().map(|(t, _)| *t));
        self.computed = self.tokens.len() - 1;
        assert_eq!(
            s.proposed,
            expected_guesses(&self.tokens, k),
            "guesses after {:?}",
            self.tokens
        );
        self.guesses = s.proposed.clone();
    }
}

fn new_sequence(id: SeqId, prompt: &[u32]) -> NewSequence {
    NewSequence {
        id,
        sampling: SamplingParams::default(),
        prompt_ids: prompt.to_vec(),
    }
}

#[test]
fn guesses_follow_the_true_context_and_output_is_the_targets() {
    let k = 3;
    let mut ex = Drafted::new(
        RuleModel::new(target_rule),
        RuleModel::new(draft_rule),
        VOCAB as usize,
    );
    let prompt_a = [3, 9, 4, 11, 5, 2, 8];
    let prompt_b = [6, 1, 7, 7, 2, 9, 4, 3, 12, 5];
    let mut a = Driven {
        id: SeqId(1),
        tokens: prompt_a.to_vec(),
        computed: 0,
        guesses: vec![],
    };
    let mut b = Driven {
        id: SeqId(2),
        tokens: prompt_b.to_vec(),
        computed: 0,
        guesses: vec![],
    };
    // Step 1: a's whole prompt, b's first part (no sample).
    let (ca, cb) = (a.chunk(k, None), b.chunk(k, Some(4)));
    let plan = StepPlan {
        new_sequences: vec![new_sequence(a.id, &prompt_a), new_sequence(b.id, &prompt_b)],
        scheduled: vec![ca.clone(), cb.clone()],
        finished: vec![],
    };
    let out = ex.step(&plan).unwrap();
    // The draft ran b's first part, a's prompt, then a guess at a time.
    assert_eq!(out.draft.map(|d| d.passes), Some(k));
    a.take(&ca, &out, k);
    b.take(&cb, &out, k);
    let mut steps = 1;
    while a.tokens.len() < prompt_a.len() + 30 {
        steps += 1;
        // b is preempted once and recomputes from the start.
        if steps == 6 {
            b.computed = 0;
            b.guesses.clear();
        }
        let (ca, cb) = (a.chunk(k, None), b.chunk(k, None));
        let plan = StepPlan {
            scheduled: vec![ca.clone(), cb.clone()],
            ..StepPlan::default()
        };
        let out = ex.step(&plan).unwrap();
        a.take(&ca, &out, k);
        b.take(&cb, &out, k);
    }
    let want_a = greedy_text(&prompt_a, a.tokens.len() - prompt_a.len());
    assert_eq!(a.tokens, want_a);
    let want_b = greedy_text(&prompt_b, b.tokens.len() - prompt_b.len());
    assert_eq!(b.tokens, want_b);
    // Most guesses are kept (the rules agree at four positions in five), so the
    // target made more than a token a step.
    assert!(a.tokens.len() - prompt_a.len() > 2 * steps, "{steps} steps");
    // A finished sequence is dropped by the draft too.
    let plan = StepPlan {
        finished: vec![a.id, b.id],
        ..StepPlan::default()
    };
    ex.step(&plan).unwrap();
    assert!(ex.draft.kv.is_empty() && ex.target.kv.is_empty());
}

#[test]
fn a_chunk_without_propose_gets_no_guesses_and_the_draft_catches_up_later() {
    let k = 2;
    let mut ex = Drafted::new(
        RuleModel::new(target_rule),
        RuleModel::new(draft_rule),
        VOCAB as usize,
    );
    let prompt = [4, 8, 15, 16, 23, 42 % VOCAB];
    let mut a = Driven {
        id: SeqId(7),
        tokens: prompt.to_vec(),
        computed: 0,
        guesses: vec![],
    };
    let mut plan = StepPlan {
        new_sequences: vec![new_sequence(a.id, &prompt)],
        ..StepPlan::default()
    };
    // Three steps that ask for nothing (a large batch), then guesses again.
    for step in 0..8 {
        let ask = if step < 3 { 0 } else { k };
        let mut c = a.chunk(ask, None);
        c.propose = ask;
        plan.scheduled = vec![c.clone()];
        let out = ex.step(&plan).unwrap();
        plan = StepPlan::default();
        let s = &out.samples[0];
        if ask == 0 {
            assert!(s.proposed.is_empty());
            a.tokens.push(s.token);
            a.tokens.extend(s.accepted.iter().map(|(t, _)| *t));
            a.computed = a.tokens.len() - 1;
            a.guesses.clear();
        } else {
            a.take(&c, &out, k);
        }
    }
    assert_eq!(
        a.tokens,
        greedy_text(&prompt, a.tokens.len() - prompt.len())
    );
}

#[test]
fn a_guess_outside_the_targets_vocabulary_ends_the_guesses() {
    fn wide(ctx: &[u32]) -> u32 {
        match ctx.len() % 3 {
            0 => VOCAB + 5,
            _ => target_rule(ctx),
        }
    }
    let mut ex = Drafted::new(
        RuleModel::new(target_rule),
        RuleModel::new(wide),
        VOCAB as usize,
    );
    let prompt = [1, 2, 3, 4];
    let a = Driven {
        id: SeqId(1),
        tokens: prompt.to_vec(),
        computed: 0,
        guesses: vec![],
    };
    let plan = StepPlan {
        new_sequences: vec![new_sequence(a.id, &prompt)],
        scheduled: vec![a.chunk(4, None)],
        finished: vec![],
    };
    let out = ex.step(&plan).unwrap();
    // After the sample (5 tokens) the draft guesses at 6 tokens' context, then its
    // third guess would come at 6 + ... : the first out-of-vocabulary one ends them.
    let mut ctx = prompt.to_vec();
    ctx.push(out.samples[0].token);
    let mut want = Vec::new();
    while want.len() < 4 {
        let t = wide(&ctx);
        if t >= VOCAB {
            break;
        }
        want.push(t);
        ctx.push(t);
    }
    assert_eq!(out.samples[0].proposed, want);
    assert!(want.len() < 4);
}
