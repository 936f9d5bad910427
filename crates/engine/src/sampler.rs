//! Choosing the next token from logits: bias, penalties, greedy or temperature with
//! top-k / top-p / min-p, and a per-sequence RNG so a fixed seed reproduces the output.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera_protocol::{SamplingParams, TokenLogprobs};

use crate::model::batch::RowReduce;
use crate::structured::TokenConstraint;

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
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_rng(&mut rand::rng()),
        };
        Self {
            params,
            rng,
            seen: prompt.iter().copied().collect(),
            counts: Default::default(),
            constraint: None,
        }
    }

    /// Constrains every later token to `constraint`'s grammar.
    pub fn with_constraint(mut self, constraint: TokenConstraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Why the sequence's grammar engine failed, if it did (the sequence must fail).
    pub fn grammar_fault(&self) -> Option<&str> {
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
        if let Some(c) = &mut self.constraint {
            c.apply_mask(logits);
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
        let raw = self.constraint.is_none()
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
            let t = temperature(&self.params);
            // The candidates at `t` (a subset of those gathered at `max(t, 1)`).
            let scaled = scaled_candidates(candidates.iter().copied(), t);
            self.draw_scaled(scaled)
                .or_else(|| candidates.first().map(|c| c.0))
                .unwrap_or(argmax)
        };
        let logprobs = self.params.logprobs.map(|k| {
            let lp = |t: u32| {
                candidates
                    .iter()
                    .find(|c| c.0 == t)
                    .map_or(f32::NEG_INFINITY, |c| c.1 - log_sum_exp)
            };
            let mut top = candidates.to_vec();
            top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            top.truncate(k);
            TokenLogprobs {
                logprob: lp(token),
                top: top
                    .into_iter()
                    .map(|(t, l)| (t, l - log_sum_exp))
                    .filter(|(_, l)| l.is_finite())
                    .collect(),
            }
        });
        (self.accept(token), logprobs)
    }

    /// Draws the next token from the row's [`sampling_candidates`] (token, raw logit),
    /// which a device gathered instead of copying the row: the same token, for the same
    /// seed, as [`Sampler::sample`] on the whole row. Only for sequences whose
    /// [`Sampler::reduction`] is `Candidates`.
    pub fn sample_candidates(&mut self, candidates: &[(u32, f32)]) -> u32 {
        let t = temperature(&self.params);
        let scaled = scaled_candidates(candidates.iter().copied(), t);
        let token = self
            .draw_scaled(scaled)
            .or_else(|| candidates.first().map(|c| c.0))
            .unwrap_or(0);
        self.accept(token)
    }

    /// Records `token`, chosen elsewhere as the arg-max, as this sequence's next token.
    pub fn accept(&mut self, token: u32) -> u32 {
        if let Some(c) = &mut self.constraint {
            c.advance(token);
        }
        self.seen.insert(token);
        *self.counts.entry(token).or_default() += 1;
        token
    }

    /// Logit bias and penalties: the distribution the model's choice is made from.
    fn adjust(&self, logits: &mut [f32]) {
        for &(tok, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(tok as usize) {
                *l += bias;
            }
        }
        let p = &self.params;
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
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
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
    let lp = |t: u32| {
        logits
            .get(t as usize)
            .map(|l| l - lse)
            .unwrap_or(f32::NEG_INFINITY)
    };
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k);
    if k > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k.saturating_sub(1), |a, b| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        });
        idx.truncate(k);
        idx.sort_by(|a, b| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        });
        // Tokens a grammar mask ruled out (`-inf`) are not alternatives.
        top = idx
            .into_iter()
            .map(|t| (t, lp(t)))
            .filter(|(_, l)| l.is_finite())
            .collect();
    }
    TokenLogprobs {
        logprob: lp(token),
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy(), &[]);
        assert_eq!(s.sample(&mut [0.1, 2.0, 2.0, -1.0]).0, 1);
    }

    /// The scan the vectorized arg-max must agree with: move on strictly larger only.
    fn argmax_by_scan(logits: &[f32]) -> u32 {
        let mut best = 0;
        for (i, l) in logits.iter().enumerate() {
            if *l > logits[best] {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn argmax_agrees_with_a_plain_scan_on_ties_nans_and_tails() {
        let mut cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![f32::NAN, 1.0, 2.0],
            vec![f32::NEG_INFINITY; 40],
            vec![f32::NAN; 17],
            vec![1.0, f32::NAN, 1.0],
        ];
        for len in [1usize, 15, 16, 17, 33, 262_144 + 5] {
            let v: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 1000) as f32 * 0.01)
                .collect();
            cases.push(v.clone());
            // The maximum repeated at both ends and in the tail, and a NaN inside.
            let mut w = v.clone();
            w[len - 1] = 50.0;
            w[len / 2] = 50.0;
            cases.push(w.clone());
            w[len / 3] = f32::NAN;
            cases.push(w);
        }
        for c in &cases {
            assert_eq!(argmax(c), argmax_by_scan(c), "{:?}", &c[..c.len().min(8)]);
        }
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(|p| p.seed = Some(seed)), &[]);
            (0..40)
                .map(|_| s.sample(&mut logits.clone()).0)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_and_min_p_restrict_the_choice() {
        let logits = vec![1.0, 3.0, 2.9, 0.0];
        let mut s = Sampler::new(
            params(|p| {
                p.top_k = 2;
                p.seed = Some(1)
            }),
            &[],
        );
        for _ in 0..50 {
            assert!([1, 2].contains(&s.sample(&mut logits.clone()).0));
        }
        let mut s = Sampler::new(
            params(|p| {
                p.min_p = 0.95;
                p.seed = Some(1)
            }),
            &[],
        );
        for _ in 0..50 {
            assert_eq!(s.sample(&mut logits.clone()).0, 1);
        }
        let mut s = Sampler::new(
            params(|p| {
                p.top_p = 0.01;
                p.seed = Some(3)
            }),
            &[],
        );
        for _ in 0..50 {
            assert_eq!(s.sample(&mut logits.clone()).0, 1);
        }
    }

    #[test]
    fn bias_and_penalties_change_the_greedy_choice() {
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.logit_bias = vec![(0, 5.0)]
            }),
            &[],
        );
        assert_eq!(s.sample(&mut [1.0, 3.0]).0, 0);
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.frequency_penalty = 2.0
            }),
            &[],
        );
        assert_eq!(s.sample(&mut [1.0, 2.0]).0, 1);
        assert_eq!(
            s.sample(&mut [1.0, 2.0]).0,
            0,
            "token 1 penalised once by 2.0"
        );
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.repetition_penalty = 2.0
            }),
            &[1],
        );
        assert_eq!(
            s.sample(&mut [1.5, 2.0]).0,
            0,
            "prompt token 1 divided by 2"
        );
    }

    #[test]
    fn logprobs_are_normalised_and_sorted() {
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.logprobs = Some(2)
            }),
            &[],
        );
        let (tok, lp) = s.sample(&mut [0.0, 1.0, 2.0]);
        let lp = lp.unwrap_or(TokenLogprobs {
            logprob: 0.0,
            top: vec![],
        });
        assert_eq!(tok, 2);
        let z: f32 = [0.0f32, 1.0, 2.0].iter().map(|x| x.exp()).sum();
        assert!((lp.logprob - (2.0 - z.ln())).abs() < 1e-5);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
    }

    /// 3000 logits drawn from `[-spread, spread)` by a fixed generator, token 7 at -inf.
    fn spread_row(seed: u64, spread: f32) -> Vec<f32> {
        let mut state = seed;
        let mut row: Vec<f32> = (0..3000)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                spread * ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
            })
            .collect();
        row[7] = f32::NEG_INFINITY;
        row
    }

    #[test]
    fn candidates_draw_what_the_whole_row_draws() {
        // Peaked and flat rows with -inf and NaN entries, under plain temperature and
        // top-k / top-p / min-p: a sampler handed the row's candidates draws the same
        // token, seed for seed, as one handed the whole row.
        let mut fewer = false;
        for spread in [0.5f32, 4.0, 30.0] {
            let mut row = spread_row(0x9e37_79b9, spread);
            row[11] = f32::NAN;
            for (t, k, top_p, min_p) in [
                (1.0, 0, 1.0, 0.0),
                (0.7, 0, 0.9, 0.0),
                (1.3, 40, 1.0, 0.05),
                (0.05, 0, 1.0, 0.0),
            ] {
                let p = params(|p| {
                    p.temperature = t;
                    p.top_k = k;
                    p.top_p = top_p;
                    p.min_p = min_p;
                    p.seed = Some(9);
                });
                let (mut whole, mut reduced) = (Sampler::new(p.clone(), &[]), Sampler::new(p, &[]));
                assert_eq!(
                    reduced.reduction(),
                    RowReduce::Candidates { temperature: t }
                );
                let cand = sampling_candidates(&row, t);
                assert!(cand.windows(2).all(|w| w[0].0 < w[1].0), "in token order");
                assert!(cand.iter().all(|(i, l)| row[*i as usize] == *l));
                fewer |= cand.len() < 2998;
                for draw in 0..40 {
                    let want = whole.sample(&mut row.clone()).0;
                    assert_eq!(
                        reduced.sample_candidates(&cand),
                        want,
                        "spread {spread} t {t} draw {draw}"
                    );
                }
            }
        }
        assert!(fewer, "some rows leave tokens out");
    }

    /// A row reduced for log-probabilities (arg-max, candidates at `max(t, 1)`, a
    /// log-sum-exp summed in another order) gives the token, seed for seed, and the
    /// log-probabilities the whole row gives.
    #[test]
    fn scored_rows_give_what_whole_rows_give() {
        for spread in [0.5f32, 4.0, 30.0] {
            let row = spread_row(0x2545_f491, spread);
            for (t, top) in [(0.0, 5), (0.0, 0), (0.7, 3), (1.6, 20), (1.0, 1)] {
                let p = params(|p| {
                    p.temperature = t;
                    p.top_p = 0.9;
                    p.logprobs = Some(top);
                    p.seed = Some(5);
                });
                let (mut whole, mut reduced) = (Sampler::new(p.clone(), &[]), Sampler::new(p, &[]));
                let RowReduce::Scored { temperature, .. } = reduced.reduction() else {
                    panic!("a raw row with log-probabilities is scored");
                };
                let cand = sampling_candidates(&row, temperature.max(1.0));
                assert!(
                    cand.len() >= top,
                    "spread {spread}: {} candidates",
                    cand.len()
                );
                let lse = row.iter().map(|l| f64::from(*l).exp()).sum::<f64>().ln() as f32;
                for draw in 0..20 {
                    let (want_token, want) = whole.sample(&mut row.clone());
                    let (token, got) = reduced.sample_scored(argmax(&row), &cand, lse);
                    let what = format!("spread {spread} t {t} top {top} draw {draw}");
                    assert_eq!(token, want_token, "{what}");
                    let (Some(got), Some(want)) = (got, want) else {
                        panic!("{what}: log-probabilities on both sides");
                    };
                    assert!((got.logprob - want.logprob).abs() < 1e-4, "{what}");
                    assert_eq!(got.top.len(), want.top.len(), "{what}");
                    for (g, w) in got.top.iter().zip(&want.top) {
                        assert_eq!(g.0, w.0, "{what}");
                        assert!((g.1 - w.1).abs() < 1e-4, "{what}: {g:?} {w:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn only_raw_logit_draws_are_reduced() {
        let reduction = |f: fn(&mut SamplingParams)| Sampler::new(params(f), &[]).reduction();
        assert_eq!(reduction(|p| p.temperature = 0.0), RowReduce::Argmax);
        assert_eq!(
            reduction(|p| p.temperature = 0.5),
            RowReduce::Candidates { temperature: 0.5 }
        );
        assert_eq!(
            reduction(|p| {
                p.temperature = 0.0;
                p.logprobs = Some(3)
            }),
            RowReduce::Scored {
                temperature: 0.0,
                top: 3
            }
        );
        assert_eq!(
            reduction(|p| {
                p.temperature = 0.5;
                p.logprobs = Some(0)
            }),
            RowReduce::Scored {
                temperature: 0.5,
                top: 0
            }
        );
        for f in [
            (|p: &mut SamplingParams| {
                p.logprobs = Some(2);
                p.logit_bias = vec![(3, 1.0)]
            }) as fn(&mut SamplingParams),
            |p| p.logit_bias = vec![(3, 1.0)],
            |p| p.repetition_penalty = 1.1,
            |p| p.presence_penalty = 0.5,
            |p| {
                p.temperature = 0.0;
                p.frequency_penalty = 0.5
            },
        ] {
            assert_eq!(reduction(f), RowReduce::Logits);
        }
    }
}
