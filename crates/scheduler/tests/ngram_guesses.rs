//! N-gram guesses through the scheduler with a fake executor: output unchanged, steps
//! saved, a stop among accepted guesses honoured, none made in a large batch.
#![allow(clippy::unwrap_used)]

mod common;

use common::{
    config, drain, expected_windowed_tokens, finished, prompt, request, run, scheduler,
    FakeExecutor,
};
use tessera_protocol::FinishReason;
use tessera_scheduler::{NgramSpeculation, SchedulerConfig};

fn ngram() -> NgramSpeculation {
    NgramSpeculation {
        num_speculative_tokens: 4,
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        disable_by_batch_size: 8,
    }
}

/// A fake model whose next token depends on the last token alone falls into a cycle,
/// which n-gram guesses then predict: the output is the same token for token, in far
/// fewer steps, and the counters say how many guesses were kept.
#[test]
fn ngram_guesses_keep_the_output_and_save_steps() {
    let p = prompt(3, 6);
    let want = expected_windowed_tokens(&p, 200, 1);
    let mut steps = Vec::new();
    for speculation in [None, Some(ngram())] {
        let mut ex = FakeExecutor::new(64, 4, 4096).with_window(1);
        let cfg = SchedulerConfig {
            speculation: speculation.map(Into::into),
            max_buffered_events: 512,
            ..config(4, 64, 8)
        };
        let mut s = scheduler(&cfg, &ex);
        let (_, mut rx) = s.submit(request(p.clone(), 200)).unwrap();
        let (_, mut other) = s.submit(request(prompt(5, 9), 30)).unwrap();
        let plans = run(&mut s, &mut ex);
        let (tokens, end) = drain(&mut rx);
        assert_eq!(tokens, want);
        assert_eq!(end, finished(FinishReason::Length, 6, 200));
        assert_eq!(
            drain(&mut other).0,
            expected_windowed_tokens(&prompt(5, 9), 30, 1)
        );
        assert_eq!(s.kv_cache().num_used_blocks(), 0);
        let m = s.metrics().speculation;
        assert_eq!(m.accepted_tokens as usize, ex.accepted_guesses);
        let drafted = plans
            .iter()
            .flat_map(|p| &p.scheduled)
            .map(|c| c.num_draft)
            .sum::<usize>();
        assert_eq!(m.draft_tokens as usize, drafted);
        if speculation.is_some() {
            assert!(m.accepted_tokens > 100, "{m:?}");
            let per_position = &m.accepted_per_position;
            assert_eq!(per_position.iter().sum::<u64>(), m.accepted_tokens);
            assert!(
                per_position.windows(2).all(|w| w[0] >= w[1]),
                "{per_position:?}"
            );
            // Never more guesses than a step's budget or the sequence's tokens left.
            for plan in &plans {
                assert!(plan.num_tokens() <= 64);
            }
        } else {
            assert_eq!((m.drafts, drafted), (0, 0));
        }
        steps.push(plans.len());
    }
    assert!(
        steps[1] * 2 < steps[0],
        "steps without and with guesses: {steps:?}"
    );
}

/// A stop token among the accepted guesses ends the sequence there: nothing after it is
/// sent.
#[test]
fn a_stop_token_among_accepted_guesses_ends_the_output_there() {
    let p = prompt(3, 6);
    let want = expected_windowed_tokens(&p, 200, 1);
    // The output's last new token: reached once the cycle is known, so by a guess.
    let k = (0..want.len())
        .rev()
        .find(|&k| !want[..k].contains(&want[k]))
        .unwrap();
    let mut ex = FakeExecutor::new(64, 4, 4096).with_window(1);
    let cfg = SchedulerConfig {
        speculation: Some(ngram().into()),
        max_buffered_events: 512,
        ..config(4, 64, 8)
    };
    let mut s = scheduler(&cfg, &ex);
    let mut req = request(p.clone(), 200);
    req.stop.stop_token_ids = vec![want[k]];
    let (_, mut rx) = s.submit(req).unwrap();
    run(&mut s, &mut ex);
    let (tokens, end) = drain(&mut rx);
    assert_eq!(tokens, want[..=k]);
    assert_eq!(end, finished(FinishReason::Stop, 6, k + 1));
    assert_eq!(s.kv_cache().num_used_blocks(), 0);
}

/// Guesses stop when the batch is large: a step decoding more sequences than
/// `disable_by_batch_size` carries none.
#[test]
fn a_large_batch_makes_no_guesses() {
    let mut ex = FakeExecutor::new(256, 4, 4096).with_window(1);
    let cfg = SchedulerConfig {
        speculation: Some(
            NgramSpeculation {
                disable_by_batch_size: 2,
                ..ngram()
            }
            .into(),
        ),
        max_buffered_events: 512,
        ..config(4, 256, 8)
    };
    let mut s = scheduler(&cfg, &ex);
    let rxs: Vec<_> = (0..3)
        .map(|i| s.submit(request(prompt(i, 6), 60)).unwrap().1)
        .collect();
    let plans = run(&mut s, &mut ex);
    for plan in &plans {
        let decoding = plan
            .scheduled
            .iter()
            .filter(|c| c.tokens.len() - c.num_draft == 1)
            .count();
        if decoding > 2 {
            assert!(plan.scheduled.iter().all(|c| c.num_draft == 0));
        }
    }
    for (i, mut rx) in rxs.into_iter().enumerate() {
        assert_eq!(
            drain(&mut rx).0,
            expected_windowed_tokens(&prompt(i as u32, 6), 60, 1)
        );
    }
}
