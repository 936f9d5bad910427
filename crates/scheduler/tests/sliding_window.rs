//! Models whose every layer attends to a sliding window: blocks behind the window go back
//! to the pool, so sequences longer than the whole cache run, each holding at most its
//! window plus one chunk. The fake executor reads only the window of each sample, and
//! fails a read of a released entry or of a slot another position overwrote.
#![allow(clippy::unwrap_used)]

mod common;

use common::{drain, expected_windowed_tokens, prompt, request, run, FakeExecutor};
use tessera_protocol::{Executor, FinishReason, StepPlan, TokenEvent, RELEASED_BLOCK};
use tessera_scheduler::{AdmissionError, Scheduler, SchedulerConfig};

const WINDOW: usize = 8;
const BLOCK: usize = 4;
/// Chunks of at most 8 tokens hold at most `(8 + 8 + 4 - 2) / 4` = 5 blocks, rounded up.
const SPAN_BLOCKS: usize = 5;

fn config(max_batch_tokens: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size_tokens: BLOCK,
        max_batch_tokens,
        max_num_seqs: 4,
        ..SchedulerConfig::default()
    }
}

fn scheduler(cfg: &SchedulerConfig, ex: &FakeExecutor) -> Scheduler {
    Scheduler::new(cfg, ex.kv_cache_shape(), ex.max_context_tokens()).unwrap()
}

/// Every chunk's table: released entries exactly before the window of its first
/// position, then at most `SPAN_BLOCKS` blocks.
fn check_tables(plans: &[StepPlan]) {
    for chunk in plans.iter().flat_map(|p| &p.scheduled) {
        let released = (chunk.start_pos + 1).saturating_sub(WINDOW) / BLOCK;
        let (gone, live) = chunk.block_table.split_at(released);
        assert!(
            gone.iter().all(|b| *b == RELEASED_BLOCK),
            "{} at {}: a block behind the window is still held",
            chunk.id,
            chunk.start_pos
        );
        assert!(
            !live.contains(&RELEASED_BLOCK),
            "{} at {}: a block in the window was released",
            chunk.id,
            chunk.start_pos
        );
        assert!(
            live.len() <= SPAN_BLOCKS,
            "{} holds {} blocks",
            chunk.id,
            live.len()
        );
    }
}

#[test]
fn sequences_longer_than_the_whole_cache_run_when_every_layer_slides() {
    // 6 blocks of 4 = 24 tokens; each request reaches 70.
    let mut ex = FakeExecutor::new(6, BLOCK, 4096).with_window(WINDOW);
    let mut s = scheduler(&config(8), &ex);
    let mut rxs = Vec::new();
    for i in 0..3 {
        let p = prompt(i, 30);
        let (_, rx) = s.submit(request(p.clone(), 40)).unwrap();
        rxs.push((p, rx));
    }
    let plans = run(&mut s, &mut ex);
    check_tables(&plans);
    assert!(
        plans.iter().any(|p| p.scheduled.len() > 1),
        "the sequences shared steps"
    );
    for (p, mut rx) in rxs {
        let (tokens, end) = drain(&mut rx);
        assert_eq!(tokens, expected_windowed_tokens(&p, 40, WINDOW));
        assert_eq!(
            end,
            Some(TokenEvent::Finished {
                reason: FinishReason::Length,
                prompt_tokens: 30,
                completion_tokens: 40
            })
        );
    }
    assert!(
        s.metrics().preemptions_total > 0,
        "three spans exceed the cache"
    );
    assert_eq!(s.kv_cache().num_used_blocks(), 0);
}

#[test]
fn without_a_window_the_cache_bounds_every_sequence() {
    let ex = FakeExecutor::new(6, BLOCK, 4096);
    let mut s = scheduler(&config(8), &ex);
    let err = s.submit(request(prompt(1, 30), 40)).unwrap_err();
    assert!(
        matches!(
            err,
            AdmissionError::NeverFits {
                needed: 70,
                limit: 24,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_window_and_a_chunk_that_overflow_the_cache_leave_the_cache_bound() {
    // Four blocks cannot hold a window of 8 and a chunk of 8 (five blocks).
    let ex = FakeExecutor::new(SPAN_BLOCKS - 1, BLOCK, 4096).with_window(WINDOW);
    let mut s = scheduler(&config(8), &ex);
    let err = s.submit(request(prompt(1, 10), 7)).unwrap_err();
    assert!(
        matches!(
            err,
            AdmissionError::NeverFits {
                needed: 17,
                limit: 16,
                ..
            }
        ),
        "{err}"
    );
    // Chunks of 4 tokens hold at most four blocks: then any length fits.
    let mut s = scheduler(&config(4), &ex);
    assert!(s.submit(request(prompt(1, 10), 70)).is_ok());
}

#[test]
fn a_cached_prefix_longer_than_the_window_is_taken_from_its_window_on() {
    let mut ex = FakeExecutor::new(64, BLOCK, 4096).with_window(WINDOW);
    let mut s = scheduler(&config(8), &ex);
    let p = prompt(7, 41);
    let (_, mut first) = s.submit(request(p.clone(), 5)).unwrap();
    run(&mut s, &mut ex);
    let (_, mut second) = s.submit(request(p.clone(), 5)).unwrap();
    let plans = run(&mut s, &mut ex);
    check_tables(&plans);
    // The 40 tokens of ten full blocks were cached; the window of position 40 starts in
    // block 8, so blocks 0..8 are not taken again.
    let head = &plans[0].scheduled[0];
    assert_eq!(head.start_pos, 40);
    assert_eq!(&head.block_table[..8], &[RELEASED_BLOCK; 8]);
    let want = expected_windowed_tokens(&p, 5, WINDOW);
    assert_eq!(drain(&mut first).0, want);
    assert_eq!(drain(&mut second).0, want);
    assert_eq!(s.kv_cache().num_used_blocks(), 0);
}
