//! The switch that decides who guesses: a sequence whose guesses keep failing stops being
//! given guesses and probes again after a back-off, resuming when its guesses hold; a
//! batch guesses less than one stream where a guess's row is dear; output never
//! changes. Driven by an executor that follows a script, so which guesses hold is known.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{drain, request};
use tessera_protocol::{Executor, ExecutorError, KvCacheShape, SampledToken, StepOutput, StepPlan};
use tessera_scheduler::{NgramSpeculation, Scheduler, SchedulerConfig};

/// The token after position `p` of every sequence is `script[p]`; a guess is kept while
/// it equals the token sampled before it, as the real executor keeps it.
struct Scripted {
    script: Vec<u32>,
}

impl Executor for Scripted {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        let samples = plan
            .scheduled
            .iter()
            .filter(|c| c.sample)
            .map(|c| {
                let base = c.end_pos() - c.num_draft;
                let token = self.script[base - 1];
                let mut accepted = Vec::new();
                let mut previous = token;
                for (i, guess) in c.tokens[c.tokens.len() - c.num_draft..].iter().enumerate() {
                    if previous != *guess {
                        break;
                    }
                    previous = self.script[base + i];
                    accepted.push((previous, None));
                }
                SampledToken {
                    id: c.id,
                    token,
                    logprobs: None,
                    prompt_logprobs: None,
                    embedding: None,
                    accepted,
                    proposed: Vec::new(),
                }
            })
            .collect();
        Ok(StepOutput {
            samples,
            failed: Vec::new(),
            draft: None,
        })
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        KvCacheShape::new(1024, 4)
    }

    fn max_context_tokens(&self) -> usize {
        4096
    }
}

const A: u32 = 1000;
const Y: u32 = 1001;

/// Tokens after a prompt of `[A]`: `x₁ A x₂ A …` for `misses` positions (a one-token match
/// on `A` always guesses the previous `x`, wrongly), then `Y₁ … Y₅ A Y₁ … Y₅ A …` (the
/// same match, and every other, now guesses right, four tokens and more ahead).
fn script(misses: usize, hits: usize) -> Vec<u32> {
    let mut s: Vec<u32> = (0..misses)
        .map(|i| if i % 2 == 0 { 2000 + i as u32 } else { A })
        .collect();
    s.extend((0..hits as u32).map(|i| if i % 6 == 5 { A } else { Y + i % 6 }));
    s
}

fn one_token_matches(k: usize) -> NgramSpeculation {
    NgramSpeculation {
        num_speculative_tokens: k,
        prompt_lookup_min: 1,
        prompt_lookup_max: 1,
        disable_by_batch_size: 64,
    }
}

/// Runs every request to its end, timing each step as a machine where a step takes
/// 1 ms plus `row_ms` per token row would; returns the plans.
fn run(s: &mut Scheduler, ex: &mut Scripted, row_ms: f64) -> Vec<StepPlan> {
    let mut plans = Vec::new();
    while s.has_work() {
        let plan = s.schedule();
        let out = ex.step(&plan).unwrap();
        let ms = 1.0 + row_ms * plan.num_tokens() as f64;
        s.record_step_duration(Duration::from_secs_f64(ms / 1e3));
        s.update(&out).unwrap();
        plans.push(plan);
        assert!(plans.len() < 100_000, "no end");
    }
    plans
}

fn scheduler(ex: &Scripted, spec: NgramSpeculation) -> Scheduler {
    let cfg = SchedulerConfig {
        block_size_tokens: 4,
        max_batch_tokens: 256,
        max_num_seqs: 16,
        max_buffered_events: 4096,
        speculation: Some(spec.into()),
        ..SchedulerConfig::default()
    };
    Scheduler::new(&cfg, ex.kv_cache_shape(), ex.max_context_tokens()).unwrap()
}

/// Guesses carried by the step that decodes position `pos` (the plans of one sequence).
fn guesses_by_position(plans: &[StepPlan]) -> Vec<(usize, usize)> {
    plans
        .iter()
        .flat_map(|p| &p.scheduled)
        .filter(|c| c.tokens.len() == 1 + c.num_draft)
        .map(|c| (c.start_pos, c.num_draft))
        .collect()
}

#[test]
fn failing_guesses_stop_and_resume_after_the_back_off() {
    let (misses, hits) = (400, 400);
    let mut ex = Scripted {
        script: script(misses, hits),
    };
    let mut s = scheduler(&ex, one_token_matches(4));
    let (_, mut rx) = s.submit(request(vec![A], misses + hits)).unwrap();
    let plans = run(&mut s, &mut ex, 0.5);
    assert_eq!(drain(&mut rx).0, ex.script[..misses + hits]);

    let steps = guesses_by_position(&plans);
    // While guesses fail: a chance every other step (after each `A`), but only the
    // first guesses and a few probes are made, further and further apart.
    let failing: Vec<usize> = steps
        .iter()
        .filter(|(pos, k)| *pos < misses && *k > 0)
        .map(|(pos, _)| *pos)
        .collect();
    assert!(
        !failing.is_empty() && failing.len() <= 12,
        "guesses while failing at {failing:?}"
    );
    let gaps: Vec<usize> = failing.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
    // When they hold again, a probe finds it within the longest back-off (32 chances,
    // 64 positions), and from then on every step guesses, several tokens at a time.
    let resumed = steps
        .iter()
        .find(|(pos, k)| *pos >= misses && *k > 0)
        .map(|(pos, _)| *pos)
        .unwrap();
    assert!(
        resumed < misses + 2 * 34,
        "first guess after the switch at {resumed}"
    );
    let after: Vec<usize> = steps
        .iter()
        .filter(|(pos, _)| *pos > resumed + 16 && *pos < misses + hits - 8)
        .map(|(_, k)| *k)
        .collect();
    assert!(after.iter().all(|&k| k >= 2), "{after:?}");
    let m = s.metrics();
    assert!(m.speculation.accepted_tokens as usize > hits / 2, "{m:?}");
    assert_eq!(m.kv_blocks_in_use, 0);
}

/// Where a guess's row costs half a one-token step, one stream guesses several tokens a
/// step on a run of sure matches, and eight streams at once (each token already shares
/// its weight reads with seven others) guess at most one each; without rows to pay for
/// (a machine where extra rows cost nothing) the batch guesses as much as one stream.
#[test]
fn a_batch_guesses_less_where_rows_are_dear() {
    let hits = 200;
    let mean_guesses = |streams: usize, row_ms: f64| {
        let mut ex = Scripted {
            script: script(0, hits),
        };
        let mut s = scheduler(&ex, one_token_matches(4));
        let rxs: Vec<_> = (0..streams)
            .map(|_| s.submit(request(vec![A], hits)).unwrap().1)
            .collect();
        let plans = run(&mut s, &mut ex, row_ms);
        for mut rx in rxs {
            assert_eq!(drain(&mut rx).0, ex.script);
        }
        // Past the first steps, once the fit of step times has enough of them.
        let later: Vec<usize> = guesses_by_position(&plans)
            .into_iter()
            .filter(|(pos, _)| *pos > 40 && *pos < hits - 8)
            .map(|(_, k)| k)
            .collect();
        later.iter().sum::<usize>() as f64 / later.len() as f64
    };
    let alone = mean_guesses(1, 1.0);
    let batch = mean_guesses(8, 1.0);
    assert!(alone > 3.0, "one stream: {alone} guesses a step");
    assert!(batch <= 1.0, "eight streams: {batch} guesses a step each");
    let free_rows = mean_guesses(8, 0.0);
    assert!(free_rows > 3.0, "eight streams, free rows: {free_rows}");
}
