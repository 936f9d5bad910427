//! When guessing pays, and how many guesses to make.
//!
//! A guess costs its row in the step whether it is kept or not, and is worth a step's
//! time per token only when kept. So the `i`-th guess after a sequence's next token is
//! made when the chance that it and every guess before it are kept exceeds the cost of
//! a row over the time per token of the step without guesses:
//!
//! ```text
//! p(kept)^i  >  β·b / (t₀ + β·b)
//! ```
//!
//! where a step of `n` token rows takes `t₀ + β·n` ([`StepCost`], measured on this
//! machine from the decode steps run so far) and `b` sequences decode in the step. With
//! one stream this is the row's cost over a one-token step (about a third on CPU for a
//! small model; far less on a GPU, where a few extra rows are nearly free); as the batch
//! grows, each weight read already serves `b` tokens and the threshold nears 1, so
//! large batches guess only on near-certain matches (and none above
//! `disable_by_batch_size`).
//!
//! `p(kept)` is estimated per sequence and per length of the n-gram match that made the
//! guess ([`GuessHistory`]): a longer match predicts better, and the guesses of
//! one-token matches in free text are mostly wrong. A match length whose estimate
//! allows no guess backs off: it skips its next few chances and then probes with one
//! guess, waiting twice as long after each probe that fails.

use std::time::Duration;

use tessera_protocol::DraftTime;

/// Match lengths told apart (longer ones are counted with this one).
const MATCH_LENGTHS: usize = 4;
/// Weight of the estimate's prior (half of the prior guesses kept): a new sequence
/// starts at one chance in two and follows its own guesses after a few steps.
const PRIOR_TRIED: f64 = 1.0;
const PRIOR_KEPT: f64 = 0.5;
/// What a guess's outcome still weighs after each later outcome of its match length:
/// the estimate follows about the last five.
const DECAY: f64 = 0.8;
/// Chances skipped after the first probe that fails, and at most.
const FIRST_BACKOFF: u32 = 4;
const MAX_BACKOFF: u32 = 32;
/// The cost of a guess's row over a one-token step until this machine's steps say
/// otherwise (SmolLM2-135M on 2 CPU cores; see docs/benchmarks.md).
const DEFAULT_ROW_COST: f64 = 0.35;
/// The step-time fit forgets at this rate per decode step (about the last 50 count).
const FIT_DECAY: f64 = 0.98;
/// A fit needs this much (decayed) weight of steps and this spread of their row counts.
const FIT_MIN_WEIGHT: f64 = 8.0;
const FIT_MIN_ROW_VARIANCE: f64 = 0.1;
/// The fitted row cost is logged when it moves by more than this.
const LOG_CHANGE: f64 = 0.05;

/// How a sequence's guesses fared, per length of the match they came from.
#[derive(Debug, Clone, Default)]
pub(crate) struct GuessHistory {
    by_match: [MatchRecord; MATCH_LENGTHS],
}

#[derive(Debug, Clone, Copy)]
struct MatchRecord {
    /// Decayed counts: guesses kept, and guesses whose outcome was seen (every kept
    /// one and the first rejected one of each step; those after it say nothing).
    kept: f64,
    tried: f64,
    /// Chances to skip before the next probe, and the back-off after that probe.
    skip: u32,
    backoff: u32,
}

impl Default for MatchRecord {
    fn default() -> Self {
        Self {
            kept: 0.0,
            tried: 0.0,
            skip: 0,
            backoff: FIRST_BACKOFF,
        }
    }
}

impl MatchRecord {
    fn p_kept(&self) -> f64 {
        (self.kept + PRIOR_KEPT) / (self.tried + PRIOR_TRIED)
    }
}

impl GuessHistory {
    fn record_mut(&mut self, match_len: usize) -> &mut MatchRecord {
        let i = match_len.clamp(1, MATCH_LENGTHS) - 1;
        &mut self.by_match[i]
    }

    /// The estimated chance that a guess from a match of `match_len` tokens is kept.
    #[cfg(test)]
    pub(crate) fn p_kept(&self, match_len: usize) -> f64 {
        self.by_match[match_len.clamp(1, MATCH_LENGTHS) - 1].p_kept()
    }

    /// How many of up to `available` guesses (from a match of `match_len` tokens) to
    /// make, when a guess pays at a chance of being kept above `threshold`. Counts a
    /// chance skipped while backing off, and schedules the next back-off at a probe.
    pub(crate) fn guesses_to_make(
        &mut self,
        match_len: usize,
        available: usize,
        threshold: f64,
    ) -> usize {
        // At odds of 1 or more no guess can pay (a draft model as costly as the model):
        // not even a probe.
        if available == 0 || threshold >= 1.0 {
            return 0;
        }
        let r = self.record_mut(match_len);
        let p = r.p_kept();
        let (mut k, mut all_kept) = (0, 1.0);
        while k < available {
            all_kept *= p;
            if all_kept <= threshold {
                break;
            }
            k += 1;
        }
        if k > 0 {
            return k;
        }
        if r.skip > 0 {
            r.skip -= 1;
            return 0;
        }
        // A probe: one guess, and a longer wait after it unless it is kept.
        r.skip = r.backoff;
        r.backoff = (r.backoff * 2).min(MAX_BACKOFF);
        1
    }

    /// A step kept `kept` of `made` guesses from a match of `match_len` tokens.
    pub(crate) fn record(&mut self, match_len: usize, made: usize, kept: usize) {
        if made == 0 {
            return;
        }
        let r = self.record_mut(match_len);
        let seen = kept + usize::from(kept < made);
        let fade = DECAY.powi(seen as i32);
        r.kept = r.kept * fade + kept as f64;
        r.tried = r.tried * fade + seen as f64;
        if kept > 0 {
            // The match length predicts again: the estimate decides from the next chance.
            r.skip = 0;
            r.backoff = FIRST_BACKOFF;
        }
    }
}

/// Step time against the token rows of decode steps, `t₀ + β·rows`, fitted by least
/// squares that forget old steps; the break-even chance of a guess follows from it.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepCost {
    /// Decayed sums over decode steps: weight, rows, seconds, rows², rows·seconds.
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    /// The latest usable fit, `(t₀, β)` in seconds.
    fit: Option<(f64, f64)>,
    /// Rows of the decode step in flight, until its duration is known.
    pending: Option<usize>,
    /// The row cost last written to the log.
    logged: Option<f64>,
    /// Decayed sums of a draft model's guessing passes and their seconds.
    draft_passes: f64,
    draft_seconds: f64,
}

impl StepCost {
    /// The step just planned decodes only (every chunk is one token and its guesses)
    /// with `rows` token rows in all; `None` for a step that prefills.
    pub(crate) fn planned(&mut self, rows: Option<usize>) {
        self.pending = rows;
    }

    /// The planned step took `duration`, of which `draft` was the draft model's.
    pub(crate) fn took(&mut self, duration: Duration, draft: Option<&DraftTime>) {
        let draft_seconds = draft.map_or(0.0, |d| d.seconds);
        if let Some(d) = draft.filter(|d| d.passes > 0) {
            self.draft_passes = self.draft_passes * FIT_DECAY + d.passes as f64;
            self.draft_seconds = self.draft_seconds * FIT_DECAY + d.seconds;
        }
        let Some(rows) = self.pending.take() else {
            return;
        };
        // The model's own part of the step is what its rows cost.
        let (x, y) = (
            rows as f64,
            (duration.as_secs_f64() - draft_seconds).max(0.0),
        );
        self.w = self.w * FIT_DECAY + 1.0;
        self.x = self.x * FIT_DECAY + x;
        self.y = self.y * FIT_DECAY + y;
        self.xx = self.xx * FIT_DECAY + x * x;
        self.xy = self.xy * FIT_DECAY + x * y;
        if self.w < FIT_MIN_WEIGHT {
            return;
        }
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let var = self.xx / self.w - mx * mx;
        if var < FIT_MIN_ROW_VARIANCE {
            // Steps of one size lately: the last fit stands.
            return;
        }
        let beta = ((self.xy / self.w - mx * my) / var).max(0.0);
        let t0 = (my - beta * mx).max(0.0);
        if t0 + beta > 0.0 {
            self.fit = Some((t0, beta));
            let rho = self.row_cost();
            if self.logged.is_none_or(|l| (l - rho).abs() > LOG_CHANGE) {
                self.logged = Some(rho);
                tracing::info!(
                    "speculation: a guessed token's row costs {rho:.2} of a one-token step \
                     (decode steps take {:.2} ms + {:.2} ms a row)",
                    t0 * 1e3,
                    beta * 1e3
                );
            }
        }
    }

    /// The cost of one more row over a one-token step (what the fit says, or the
    /// default before it says anything).
    pub(crate) fn row_cost(&self) -> f64 {
        match self.fit {
            Some((t0, beta)) => beta / (t0 + beta),
            None => DEFAULT_ROW_COST,
        }
    }

    /// The chance of being kept above which a guess pays in a step decoding `batch`
    /// sequences: a row's cost over the step's time per token without guesses.
    pub(crate) fn threshold(&self, batch: usize) -> f64 {
        let rho = self.row_cost();
        let b = batch.max(1) as f64;
        rho * b / (1.0 - rho + rho * b)
    }

    /// The same for a draft model's guess, which also costs the draft's pass that
    /// makes it (`δ`, shared by the `b` sequences guessing in it): `(β·b + δ) / (t₀ +
    /// β·b)`. Above 1 (a draft as costly as the model) no guess pays. Before the step
    /// times are fitted, or the draft has made a guess, the row's cost alone.
    pub(crate) fn draft_threshold(&self, batch: usize) -> f64 {
        let (Some((t0, beta)), true) = (self.fit, self.draft_passes > 0.0) else {
            return self.threshold(batch);
        };
        let delta = self.draft_seconds / self.draft_passes;
        let b = batch.max(1) as f64;
        (beta * b + delta) / (t0 + beta * b)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn guesses_grow_while_kept_and_stop_when_rejected() {
        let mut h = GuessHistory::default();
        // One chance in two at first: one guess at a third's break-even.
        assert_eq!(h.guesses_to_make(4, 4, 0.35), 1);
        for _ in 0..6 {
            let k = h.guesses_to_make(4, 4, 0.35);
            h.record(4, k, k);
        }
        assert_eq!(h.guesses_to_make(4, 4, 0.35), 4, "{}", h.p_kept(4));
        // Rejected again and again: no guesses, then one probe after the back-off.
        for _ in 0..6 {
            h.record(4, 4, 0);
        }
        assert!(h.p_kept(4) < 0.35);
        let made: Vec<usize> = (0..20).map(|_| h.guesses_to_make(4, 4, 0.35)).collect();
        assert_eq!(made[0], 1, "{made:?}");
        assert_eq!(made[1..=FIRST_BACKOFF as usize], [0; 4], "{made:?}");
        assert_eq!(made[1 + FIRST_BACKOFF as usize], 1, "{made:?}");
        // Each failed probe doubles the wait (the probes here were never recorded).
        let gap = made[2 + FIRST_BACKOFF as usize..]
            .iter()
            .take_while(|&&k| k == 0)
            .count();
        assert_eq!(gap, 2 * FIRST_BACKOFF as usize, "{made:?}");
        // Other match lengths keep their own record.
        assert_eq!(h.guesses_to_make(2, 4, 0.35), 1);
    }

    #[test]
    fn a_kept_probe_ends_the_back_off() {
        let mut h = GuessHistory::default();
        for _ in 0..8 {
            h.record(1, 1, 0);
        }
        assert_eq!(h.guesses_to_make(1, 4, 0.35), 1);
        h.record(1, 1, 1);
        // The next chance probes again at once rather than waiting.
        assert_eq!(h.guesses_to_make(1, 4, 0.35), 1);
    }

    #[test]
    fn the_fit_finds_the_row_cost_and_the_batch_raises_the_threshold() {
        let mut c = StepCost::default();
        assert_eq!(c.row_cost(), DEFAULT_ROW_COST);
        // 4 ms a step plus 2 ms a row: a one-token step takes 6 ms, a row a third of it.
        for i in 0..40 {
            let rows = 1 + i % 5;
            c.planned(Some(rows));
            c.took(Duration::from_micros(4000 + 2000 * rows as u64), None);
        }
        assert!((c.row_cost() - 1.0 / 3.0).abs() < 1e-6, "{}", c.row_cost());
        assert!((c.threshold(1) - 1.0 / 3.0).abs() < 1e-6);
        assert!(c.threshold(8) > 0.75 && c.threshold(8) < c.threshold(16));
        // Steps of one size only (no guesses for a while): the fit stands; prefill
        // steps are not counted.
        for _ in 0..400 {
            c.planned(Some(1));
            c.took(Duration::from_millis(6), None);
            c.planned(None);
            c.took(Duration::from_secs(1), None);
        }
        assert!((c.row_cost() - 1.0 / 3.0).abs() < 1e-6, "{}", c.row_cost());
    }

    #[test]
    fn a_draft_pass_raises_the_threshold_by_its_cost() {
        let mut c = StepCost::default();
        // The model: 4 ms a step plus 2 ms a row; its draft: 1 ms a pass, one pass per
        // guess. The step time includes the draft's, which the fit leaves out.
        for i in 0..40 {
            let rows = 1 + i % 5;
            let passes = rows - 1;
            c.planned(Some(rows));
            let draft = DraftTime {
                passes,
                seconds: passes as f64 * 1e-3,
            };
            let us = 4000 + 2000 * rows as u64 + 1000 * passes as u64;
            c.took(Duration::from_micros(us), Some(&draft));
        }
        assert!((c.row_cost() - 1.0 / 3.0).abs() < 1e-6, "{}", c.row_cost());
        // One stream: (2 + 1) / (4 + 2).
        assert!(
            (c.draft_threshold(1) - 0.5).abs() < 1e-6,
            "{}",
            c.draft_threshold(1)
        );
        // Four: (8 + 1) / (4 + 8); the draft's pass is shared.
        assert!((c.draft_threshold(4) - 0.75).abs() < 1e-6);
        // A draft as costly as a step of the model: no chance pays.
        let mut c = StepCost::default();
        for i in 0..40 {
            let rows = 1 + i % 5;
            c.planned(Some(rows));
            let draft = DraftTime {
                passes: 4,
                seconds: 4.0 * 6e-3,
            };
            c.took(
                Duration::from_micros(4000 + 2000 * rows as u64 + 24_000),
                Some(&draft),
            );
        }
        assert!(c.draft_threshold(1) >= 1.0, "{}", c.draft_threshold(1));
        let mut h = GuessHistory::default();
        assert_eq!(h.guesses_to_make(0, 4, c.draft_threshold(1)), 0);
    }
}
