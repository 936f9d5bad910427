//! Choosing the next token from logits: bias, penalties, greedy or temperature with
//! top-k / top-p / min-p, and a per-sequence RNG so a fixed seed reproduces the output.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera_protocol::{SamplingParams, TokenLogprobs};

use crate::model::batch::RowReduce;
use crate::structured::{GrammarFault, ThinkingGate, TokenConstraint};
use crate::thinking_budget::BudgetGate;

/// Sampling state of one sequence, kept by the engine for the sequence's whole life
/// (across preemptions), so seeded sampling does not depend on batching.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Distinct tokens of the prompt and of the output (repetition penalty).
    seen: std::collections::HashSet<u32>,
    /// Occurrences of each generated token (presence / frequency penalties).
    counts: std::collections::HashMap<u32, u32>,
    /// The grammar a constrained sequence must follow (`response_format`).
    constraint: Option<TokenConstraint>,
    /// A thinking block the grammar waits for the end of.
    thinking: Option<ThinkingGate>,
    /// A cap on the reply's thinking.
    budget: Option<BudgetGate>,
    /// Tokens sampled so far (`min_tokens`).
    generated: usize,
    /// The latest sampled tokens, as many as the longest bad word has before its last
    /// (`bad_word_context`).
    recent: Vec<u32>,
    bad_word_context: usize,
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_rng(&mut rand::rng()),
        };
        let bad_word_context = params
            .bad_words
            .iter()
            .map(|w| w.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        let budget = params.thinking_budget.clone().map(BudgetGate::new);
        Self {
            params,
            rng,
            seen: prompt.iter().copied().collect(),
            counts: Default::default(),
            constraint: None,
            thinking: None,
            budget,
            generated: 0,
            recent: Vec::new(),
            bad_word_context,
        }
    }

    /// Constrains every later token to `constraint`'s grammar.
    pub fn with_constraint(mut self, constraint: TokenConstraint) -> Self {
        self.constraint = Some(constraint);
        self.thinking = self.params.thinking.as_ref().map(ThinkingGate::new);
        self
    }

    /// Why the sequence's grammar engine failed, if it did (the sequence must fail).
    pub fn grammar_fault(&self) -> Option<&GrammarFault> {
        self.constraint.as_ref().and_then(TokenConstraint::fault)
    }

    /// The grammar state of a constrained sequence.
    pub fn constraint(&self) -> Option<&TokenConstraint> {
        self.constraint.as_ref()
    }

    /// Picks the next token from `logits` (modified in place) and records it. A
    /// constrained sequence's grammar mask is applied after bias and penalties, so the
    /// choice and the log-probabilities are those of the masked distribution.
    pub fn sample(&mut self, logits: &mut [f32]) -> (u32, Option<TokenLogprobs>) {
        self.adjust(logits);
        if let Some(forced) = self.budget.as_ref().and_then(BudgetGate::forced) {
            // The thinking budget is spent: only the closing tag's next token remains.
            let kept = logits.get(forced as usize).copied();
            logits.fill(f32::NEG_INFINITY);
            if let Some(l) = kept {
                logits[forced as usize] = if l.is_finite() { l } else { 0.0 };
            }
        }
        let gate = self.thinking.as_ref();
        if let Some(c) = self
            .constraint
            .as_mut()
            .filter(|_| gate.is_none_or(|g| g.grammar_masks()))
        {
            // The first token may open a thinking block instead of starting the grammar.
            let open = gate
                .and_then(ThinkingGate::may_open)
                .and_then(|t| logits.get(t as usize).map(|l| (t, *l)));
            c.apply_mask(logits);
            if let Some((t, logit)) = open {
                logits[t as usize] = logit;
            }
            if logits.iter().all(|l| *l == f32::NEG_INFINITY) {
                // Bias and `bad_words` took away every token the grammar allows.
                c.no_token_left();
            }
        }
        let token = if self.params.is_greedy() {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        let logprobs = self.params.logprobs.map(|k| logprobs_of(logits, token, k));
        (self.accept(token), logprobs)
    }

    /// What of its logits row the next token needs. With no bias, no penalties and no
    /// grammar mask, the raw logits decide: a greedy sequence needs only their arg-max
    /// ([`Sampler::accept`]), a sampled one only its candidates
    /// ([`Sampler::sample_candidates`]), one that reports log-probabilities those and the
    /// row's log-sum-exp ([`Sampler::sample_scored`]); the device may reduce the row to
    /// that. Anything else needs the whole row ([`Sampler::sample`]).
    pub fn reduction(&self) -> RowReduce {
        let p = &self.params;
        let masked = self.constraint.is_some()
            && self
                .thinking
                .as_ref()
                .is_none_or(ThinkingGate::grammar_masks);
        let forcing = self.budget.as_ref().is_some_and(|b| b.forced().is_some());
        let raw = !masked
            && !forcing
            && !self.blocks_stop_tokens()
            && p.allowed_token_ids.is_empty()
            && p.bad_words.is_empty()
            && p.logit_bias.is_empty()
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0;
        let t = if p.is_greedy() { 0.0 } else { temperature(p) };
        match (raw, p.logprobs) {
            (false, _) => RowReduce::Logits,
            (true, Some(top)) => RowReduce::Scored {
                temperature: t,
                top,
            },
            (true, None) if p.is_greedy() => RowReduce::Argmax,
            (true, None) => RowReduce::Candidates { temperature: t },
        }
    }

    /// The next token and its log-probabilities from what a device reduced the row to
    /// ([`RowReduce::Scored`]): its arg-max, its candidates at `max(temperature, 1)` (by
    /// token; at least as many as the log-probabilities asked for) and its log-sum-exp.
    /// The same token, for the same seed, and the same log-probabilities (up to the
    /// order of the device's sum) as [`Sampler::sample`] on the whole row.
    pub fn sample_scored(
        &mut self,
        argmax: u32,
        candidates: &[(u32, f32)],
        log_sum_exp: f32,
    ) -> (u32, Option<TokenLogprobs>) {
        let token = if self.params.is_greedy() {
            argmax
        } else {
            // The candidates at the temperature are a subset of those gathered at
            // `max(temperature, 1)`.
            self.draw_candidates(candidates).unwrap_or(argmax)
        };
        let logprobs = self.params.logprobs.map(|k| {
            let logit = candidates.iter().find(|c| c.0 == token).map(|c| c.1);
            token_logprobs(
                logit,
                most_likely(candidates.iter().copied(), k),
                log_sum_exp,
            )
        });
        (self.accept(token), logprobs)
    }

    /// Draws the next token from the row's [`sampling_candidates`] (token, raw logit),
    /// which a device gathered instead of copying the row: the same token, for the same
    /// seed, as [`Sampler::sample`] on the whole row. Only for sequences whose
    /// [`Sampler::reduction`] is `Candidates`.
    pub fn sample_candidates(&mut self, candidates: &[(u32, f32)]) -> u32 {
        let token = self.draw_candidates(candidates).unwrap_or(0);
        self.accept(token)
    }

    /// A draw at this sequence's temperature from `(token, raw logit)` candidates (a
    /// superset of those the temperature keeps); `None` when there are none.
    fn draw_candidates(&mut self, candidates: &[(u32, f32)]) -> Option<u32> {
        let scaled = scaled_candidates(candidates.iter().copied(), temperature(&self.params));
        self.draw_scaled(scaled)
            .or_else(|| candidates.first().map(|c| c.0))
    }

    /// Records `token`, chosen elsewhere as the arg-max, as this sequence's next token.
    pub fn accept(&mut self, token: u32) -> u32 {
        let grammar_text = match (&mut self.thinking, &self.constraint) {
            (Some(gate), Some(c)) => gate.accept(token, || c.token_bytes(token)),
            _ => true,
        };
        if let Some(c) = self.constraint.as_mut().filter(|_| grammar_text) {
            c.advance(token);
        }
        if let Some(b) = &mut self.budget {
            b.accept(token);
        }
        self.seen.insert(token);
        *self.counts.entry(token).or_default() += 1;
        self.generated += 1;
        if self.bad_word_context > 0 {
            self.recent.push(token);
            if self.recent.len() > self.bad_word_context {
                self.recent.remove(0);
            }
        }
        token
    }

    /// Whether the stop tokens are still masked: fewer than `min_tokens` are generated.
    fn blocks_stop_tokens(&self) -> bool {
        self.generated < self.params.min_tokens && !self.params.min_tokens_blocked.is_empty()
    }

    /// Logit bias, penalties and the `min_tokens` mask: the distribution the model's
    /// choice is made from.
    fn adjust(&self, logits: &mut [f32]) {
        let p = &self.params;
        if !p.allowed_token_ids.is_empty() {
            let allowed: Vec<(u32, f32)> = p
                .allowed_token_ids
                .iter()
                .filter_map(|&t| logits.get(t as usize).map(|l| (t, *l)))
                .collect();
            logits.fill(f32::NEG_INFINITY);
            for (t, l) in allowed {
                logits[t as usize] = l;
            }
        }
        for word in &p.bad_words {
            if let Some((last, before)) = word.split_last() {
                if self.recent.ends_with(before) {
                    if let Some(l) = logits.get_mut(*last as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
        if self.blocks_stop_tokens() {
            for &tok in &p.min_tokens_blocked {
                if let Some(l) = logits.get_mut(tok as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for &(tok, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(tok as usize) {
                *l += bias;
            }
        }
        if p.repetition_penalty != 1.0 {
            for &tok in &self.seen {
                if let Some(l) = logits.get_mut(tok as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&tok, &count) in &self.counts {
                if let Some(l) = logits.get_mut(tok as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * count as f32;
                }
            }
        }
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        let t = temperature(&self.params);
        let all = logits.iter().enumerate().map(|(i, l)| (i as u32, *l));
        self.draw_scaled(scaled_candidates(all, t))
            .unwrap_or_else(|| argmax(logits))
    }

    /// Draws from `(token, logit / temperature)` candidates; `None` when there are none.
    fn draw_scaled(&mut self, mut cand: Vec<(u32, f32)>) -> Option<u32> {
        let p = &self.params;
        cand.sort_by(more_likely_first);
        if p.top_k > 0 {
            cand.truncate(p.top_k);
        }
        let &(best, max) = cand.first()?;
        let mut probs: Vec<f32> = cand.iter().map(|(_, l)| (l - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, pr) in probs.iter().enumerate() {
                acc += pr;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p;
            keep = keep.min(probs.iter().take_while(|pr| **pr >= floor).count().max(1));
        }
        let mass: f32 = probs[..keep].iter().sum();
        let mut r = self.rng.random::<f32>() * mass;
        for (i, pr) in probs[..keep].iter().enumerate() {
            r -= pr;
            if r <= 0.0 {
                return Some(cand[i].0);
            }
        }
        Some(cand.get(keep - 1).map(|c| c.0).unwrap_or(best))
    }
}

/// A sampled sequence's temperature, kept off zero.
fn temperature(p: &SamplingParams) -> f32 {
    p.temperature.max(1e-5)
}

/// Tokens whose probability relative to the best is under 2^-25: added after the best
/// token's 1.0 they cannot change an f32 sum, so leaving them out changes neither the
/// distribution nor the draw for a seed.
pub const NEGLIGIBLE: f32 = -17.33; // ln(2^-25)

/// `(token, logit / t)` of the finite `(token, logit)` pairs within [`NEGLIGIBLE`] of the
/// best scaled logit, in the pairs' order.
fn scaled_candidates(pairs: impl Iterator<Item = (u32, f32)> + Clone, t: f32) -> Vec<(u32, f32)> {
    let max = pairs
        .clone()
        .filter(|(_, l)| l.is_finite())
        .fold(f32::NEG_INFINITY, |m, (_, l)| m.max(l / t));
    pairs
        .filter(|(_, l)| l.is_finite())
        .map(|(i, l)| (i, l / t))
        .filter(|(_, l)| *l - max >= NEGLIGIBLE)
        .collect()
}

/// The tokens a draw at temperature `t` (kept off zero) can pick from `logits`: `(token,
/// logit)` of every finite logit whose `logit / t` is within [`NEGLIGIBLE`] of the best,
/// in token order. A GPU gathers the same set on the device (`kernels/cuda/candidates.cu`).
pub fn sampling_candidates(logits: &[f32], t: f32) -> Vec<(u32, f32)> {
    let t = t.max(1e-5);
    let all = logits.iter().enumerate().map(|(i, l)| (i as u32, *l));
    scaled_candidates(all.clone(), t)
        .into_iter()
        .map(|(i, _)| (i, logits[i as usize]))
        .collect()
}

/// Index of the largest logit; the lowest index wins ties.
pub fn argmax(logits: &[f32]) -> u32 {
    // The largest value first, in sixteen independent lanes (a loop that vectorizes: a
    // 262144-token vocabulary is scanned for each of a batch's rows on one thread), then
    // its first index. NaN never wins, and a NaN first logit keeps index 0, as in a scan
    // that moves only to a strictly larger value.
    let Some(&first) = logits.first() else {
        return 0;
    };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = logits.chunks_exact(16);
    for &l in chunks.remainder() {
        lanes[0] = if l > lanes[0] { l } else { lanes[0] };
    }
    for c in chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            *m = if l > *m { l } else { *m };
        }
    }
    let max = lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
    // `max` is never NaN: lanes start at -inf and take only larger values.
    if first.is_nan() || max <= first {
        return 0;
    }
    logits.iter().position(|&l| l == max).unwrap_or(0) as u32
}

/// Log-softmax value of `token` and the `k` most likely tokens.
pub fn logprobs_of(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
    let pairs = logits.iter().enumerate().map(|(i, l)| (i as u32, *l));
    token_logprobs(
        logits.get(token as usize).copied(),
        most_likely(pairs, k),
        lse,
    )
}

/// The larger logit first, the lower token among equal ones.
fn more_likely_first(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `k` most likely of `(token, logit)` pairs, most likely first.
fn most_likely(pairs: impl Iterator<Item = (u32, f32)>, k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    let mut all: Vec<(u32, f32)> = pairs.collect();
    let k = k.min(all.len());
    if k < all.len() {
        all.select_nth_unstable_by(k - 1, more_likely_first);
        all.truncate(k);
    }
    all.sort_by(more_likely_first);
    all
}

/// The chosen token's log-probability (from its logit, if known) and the alternatives'
/// (`top`, most likely first), given the row's log-sum-exp. Tokens a grammar mask ruled
/// out (`-inf`) are not alternatives.
fn token_logprobs(logit: Option<f32>, top: Vec<(u32, f32)>, lse: f32) -> TokenLogprobs {
    TokenLogprobs {
        logprob: logit.map_or(f32::NEG_INFINITY, |l| l - lse),
        top: top
            .into_iter()
            .map(|(t, l)| (t, l - lse))
            .filter(|(_, l)| l.is_finite())
            .collect(),
    }
}
