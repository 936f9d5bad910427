//! The engine loop on its own thread, driven through `SchedulerHandle`.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{expected_tokens, prompt, request, FakeExecutor};
use tessera_protocol::{FinishReason, TokenEvent};
use tessera_scheduler::TokenReceiver;
use tessera_scheduler::{AdmissionError, EngineLoop, SchedulerConfig, SchedulerHandle};

fn config() -> SchedulerConfig {
    SchedulerConfig {
        block_size_tokens: 4,
        max_batch_tokens: 32,
        max_num_seqs: 8,
        ..SchedulerConfig::default()
    }
}

/// Block until the terminal event; returns the tokens and it.
fn collect(rx: &mut TokenReceiver) -> (Vec<u32>, Option<TokenEvent>) {
    let mut tokens = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            TokenEvent::Token { token, .. } => tokens.push(token),
            end => return (tokens, Some(end)),
        }
    }
    (tokens, None)
}

#[test]
fn requests_from_several_threads_complete_and_metrics_are_published() {
    let ex = FakeExecutor::new(64, 4, 4096);
    let handle = EngineLoop::spawn(config(), ex).unwrap();
    let workers: Vec<_> = (0..4u32)
        .map(|i| {
            let h: SchedulerHandle = handle.clone();
            std::thread::spawn(move || {
                let p = prompt(i, 5 + i as usize * 3);
                let (_, mut rx) = h.submit(request(p.clone(), 6)).unwrap();
                let (tokens, end) = collect(&mut rx);
                assert_eq!(tokens, expected_tokens(&p, 6));
                assert_eq!(
                    end,
                    Some(TokenEvent::Finished {
                        reason: FinishReason::Length,
                        prompt_tokens: p.len(),
                        completion_tokens: 6
                    })
                );
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    // Metrics are published after each step; the last step may still be in progress.
    let mut m = handle.metrics();
    for _ in 0..200 {
        if m.generation_tokens_total == 24 && m.num_running == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
        m = handle.metrics();
    }
    assert_eq!(m.generation_tokens_total, 24);
    assert_eq!(m.prompt_tokens_total, (5 + 8 + 11 + 14) as u64);
    assert_eq!(m.num_running, 0);
    assert_eq!(m.kv_blocks_total, 64);
    assert!(m.steps_total >= 6);
    handle.join().unwrap();
}

/// Submits two long requests; each must end with the fake executor's injected error
/// (as `make` builds the event), and `check` runs as each one hears of it.
fn two_requests_end_with_the_injected_error(
    handle: &SchedulerHandle,
    make: fn(String) -> TokenEvent,
    check: impl Fn(),
) {
    let (_, mut r1) = handle.submit(request(prompt(1, 5), 2000)).unwrap();
    let (_, mut r2) = handle.submit(request(prompt(2, 5), 2000)).unwrap();
    for rx in [&mut r1, &mut r2] {
        let (_, end) = collect(rx);
        assert_eq!(end, Some(make("rank 1: injected device failure".into())));
        check();
    }
}

fn finished_with_length(end: Option<TokenEvent>) -> bool {
    matches!(
        end,
        Some(TokenEvent::Finished {
            reason: FinishReason::Length,
            ..
        })
    )
}

#[test]
fn a_failed_step_fails_its_sequences_and_the_loop_keeps_serving() {
    let mut ex = FakeExecutor::new(1024, 4, 4096);
    let failed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&failed);
    // Fail once, the first time both requests are in the same step.
    ex.fail_when = Some(Box::new(move |plan| {
        plan.scheduled.len() == 2 && !flag.swap(true, Ordering::SeqCst)
    }));
    ex.step_delay = Duration::from_millis(1);
    let handle = EngineLoop::spawn(config(), ex).unwrap();
    two_requests_end_with_the_injected_error(&handle, TokenEvent::Failed, || ());
    assert!(failed.load(Ordering::SeqCst));
    let h = handle.health();
    assert!(h.running && !h.executor_failed, "{h:?}");
    let p = prompt(3, 7);
    let (_, mut r3) = handle.submit(request(p.clone(), 5)).unwrap();
    let (tokens, end) = collect(&mut r3);
    assert_eq!(tokens, expected_tokens(&p, 5));
    assert!(finished_with_length(end));
    handle.join().unwrap();
}

/// Only the sequences of the failed step end: a request waiting for a slot (one
/// sequence runs at a time here) runs afterwards and generates exactly its tokens.
#[test]
fn a_failed_step_leaves_waiting_requests_alone() {
    let mut ex = FakeExecutor::new(1024, 4, 4096);
    let flag = Arc::new(AtomicBool::new(false));
    let armed = Arc::clone(&flag);
    // The running request's third step fails.
    let steps = Arc::new(std::sync::atomic::AtomicU32::new(0));
    ex.fail_when = Some(Box::new(move |plan| {
        !plan.scheduled.is_empty()
            && steps.fetch_add(1, Ordering::SeqCst) == 2
            && !armed.swap(true, Ordering::SeqCst)
    }));
    ex.step_delay = Duration::from_millis(2);
    let cfg = SchedulerConfig {
        max_num_seqs: 1,
        ..config()
    };
    let handle = EngineLoop::spawn(cfg, ex).unwrap();
    let (_, mut first) = handle.submit(request(prompt(1, 5), 50)).unwrap();
    let p = prompt(2, 6);
    let (_, mut second) = handle.submit(request(p.clone(), 7)).unwrap();
    let (tokens, end) = collect(&mut first);
    assert_eq!(tokens, expected_tokens(&prompt(1, 5), 2));
    assert_eq!(
        end,
        Some(TokenEvent::Failed("rank 1: injected device failure".into()))
    );
    let (tokens, end) = collect(&mut second);
    assert_eq!(tokens, expected_tokens(&p, 7));
    assert!(finished_with_length(end));
    assert!(flag.load(Ordering::SeqCst));
    handle.join().unwrap();
}

/// A sequence the executor refuses ends alone; the one beside it in the same steps
/// finishes with exactly its tokens.
#[test]
fn a_refused_sequence_fails_alone() {
    let mut ex = FakeExecutor::new(1024, 4, 4096);
    ex.poison_token = Some(999);
    ex.step_delay = Duration::from_millis(1);
    let handle = EngineLoop::spawn(config(), ex).unwrap();
    let good = prompt(1, 6);
    let (_, mut bad_rx) = handle.submit(request(vec![5, 999, 7], 20)).unwrap();
    let (_, mut good_rx) = handle.submit(request(good.clone(), 20)).unwrap();
    let (tokens, end) = collect(&mut bad_rx);
    assert!(tokens.is_empty());
    assert_eq!(
        end,
        Some(TokenEvent::Failed(
            "token 999 is outside the embedding".into()
        ))
    );
    let (tokens, end) = collect(&mut good_rx);
    assert_eq!(tokens, expected_tokens(&good, 20));
    assert!(finished_with_length(end));
    assert!(handle.health().running);
    handle.join().unwrap();
}

#[test]
fn a_failed_executor_fails_every_request_and_stops_the_loop() {
    let mut ex = FakeExecutor::new(1024, 4, 4096);
    ex.failure_is_fatal = true;
    ex.fail_when = Some(Box::new(|plan| plan.scheduled.len() == 2));
    ex.step_delay = Duration::from_millis(1);
    let handle = EngineLoop::spawn(config(), ex).unwrap();
    two_requests_end_with_the_injected_error(&handle, TokenEvent::Error, || {
        // Health already says so when the request hears of it.
        let h = handle.health();
        assert!(h.executor_failed && !h.panicked, "{h:?}");
    });
    assert_eq!(
        handle.submit(request(prompt(3, 5), 5)).unwrap_err(),
        AdmissionError::ShuttingDown
    );
    handle.join().unwrap();
    assert!(!handle.health().running);
}

/// An executor lost outside any step (a node of its group gone while idle, or between
/// steps): the running request ends with the reason, health says so first, admission
/// closes and the loop exits, as after a step that failed the group.
#[test]
fn a_lost_executor_fails_every_request_and_stops_the_loop() {
    let mut ex = FakeExecutor::new(2048, 4, 8192);
    ex.step_delay = Duration::from_millis(1);
    let handle = EngineLoop::spawn(config(), ex).unwrap();
    let notifier = handle.loss_notifier();
    let (_, mut rx) = handle.submit(request(prompt(1, 5), 5000)).unwrap();
    assert!(matches!(rx.blocking_recv(), Some(TokenEvent::Token { .. })));
    notifier.executor_lost("node 1 disconnected while idle".into());
    let (tokens, end) = collect(&mut rx);
    assert!(tokens.len() < 5000);
    assert_eq!(
        end,
        Some(TokenEvent::Error("node 1 disconnected while idle".into()))
    );
    let h = handle.health();
    assert!(h.executor_failed && !h.running, "{h:?}");
    assert_eq!(
        handle.submit(request(prompt(2, 5), 5)).unwrap_err(),
        AdmissionError::ShuttingDown
    );
    handle.join().unwrap();
    // The loop is gone: the notifier's word goes nowhere and does not panic.
    notifier.executor_lost("again".into());
}

#[test]
fn shutdown_aborts_in_flight_and_refuses_new_requests() {
    let mut ex = FakeExecutor::new(2048, 4, 8192);
    ex.step_delay = Duration::from_millis(1);
    let handle = EngineLoop::spawn(config(), ex).unwrap();
    let (_, mut rx) = handle.submit(request(prompt(1, 5), 5000)).unwrap();
    // Wait for the first token so the request is running.
    assert!(matches!(rx.blocking_recv(), Some(TokenEvent::Token { .. })));
    handle.join().unwrap();
    let (tokens, end) = collect(&mut rx);
    assert!(tokens.len() < 5000);
    assert!(matches!(
        end,
        Some(TokenEvent::Finished {
            reason: FinishReason::Abort,
            prompt_tokens: 5,
            ..
        })
    ));
    assert_eq!(
        handle.submit(request(prompt(2, 5), 5)).unwrap_err(),
        AdmissionError::ShuttingDown
    );
}

#[test]
fn dropping_a_receiver_cancels_the_request_in_the_loop() {
    let mut ex = FakeExecutor::new(2048, 4, 8192);
    ex.step_delay = Duration::from_millis(1);
    let plans = Arc::clone(&ex.plans);
    let handle = EngineLoop::spawn(config(), ex).unwrap();
    let (id, mut rx) = handle.submit(request(prompt(1, 5), 5000)).unwrap();
    assert!(matches!(rx.blocking_recv(), Some(TokenEvent::Token { .. })));
    drop(rx);
    let mut done = false;
    for _ in 0..400 {
        if plans
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.finished.contains(&id))
        {
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(done, "the aborted sequence is listed in `finished`");
    std::thread::sleep(Duration::from_millis(20));
    let m = handle.metrics();
    assert_eq!((m.num_running, m.kv_blocks_in_use), (0, 0));
}

#[test]
fn spawn_rejects_a_block_size_the_executor_does_not_use() {
    let ex = FakeExecutor::new(64, 8, 4096);
    let err = EngineLoop::spawn(config(), ex).unwrap_err();
    assert!(err.to_string().contains("block_size_tokens is 4"), "{err}");
}

#[test]
fn submit_answers_queue_full_without_waiting_for_the_loop() {
    let mut ex = FakeExecutor::new(2048, 4, 8192);
    ex.step_delay = Duration::from_millis(2);
    let cfg = SchedulerConfig {
        max_waiting: 1,
        max_num_seqs: 1,
        ..config()
    };
    let handle = EngineLoop::spawn(cfg, ex).unwrap();
    let (_, mut running) = handle.submit(request(prompt(1, 5), 3000)).unwrap();
    assert!(matches!(
        running.blocking_recv(),
        Some(TokenEvent::Token { .. })
    ));
    // One slot in the queue (max_num_seqs = 1 keeps it waiting), then refusal.
    let (_, _waiting) = handle.submit(request(prompt(2, 5), 5)).unwrap();
    let err = handle.submit(request(prompt(3, 5), 5)).unwrap_err();
    assert_eq!(
        err,
        AdmissionError::QueueFull {
            waiting: 1,
            max_waiting: 1
        }
    );
    assert!(err.to_string().contains("max_waiting = 1"));
    assert_eq!(handle.num_queued(), 1);
}

#[test]
fn one_token_requests_through_a_single_slot_all_complete() {
    // Each step admits one request that finishes in that same step, so no sequence is
    // running between steps while others still wait: this must not look like a stall.
    let ex = FakeExecutor::new(64, 4, 4096);
    let cfg = SchedulerConfig {
        max_num_seqs: 1,
        ..config()
    };
    let handle = EngineLoop::spawn(cfg, ex).unwrap();
    let mut rxs: Vec<_> = (0..10u32)
        .map(|i| {
            let p = prompt(i, 3);
            (p.clone(), handle.submit(request(p, 1)).unwrap().1)
        })
        .collect();
    for (p, rx) in &mut rxs {
        let (tokens, end) = collect(rx);
        assert_eq!(tokens, expected_tokens(p, 1));
        assert!(matches!(
            end,
            Some(TokenEvent::Finished {
                reason: FinishReason::Length,
                completion_tokens: 1,
                ..
            })
        ));
    }
    handle.join().unwrap();
}

/// Backpressure: a client that does not read gets only what its channel holds (less
/// one slot kept for the final event), then no more steps; the loop does not spin
/// meanwhile, other requests run, and once the client reads the request goes on to
/// exactly the tokens it would have had.
#[test]
fn a_client_that_does_not_read_stops_being_scheduled() {
    let mut ex = FakeExecutor::new(1024, 4, 4096);
    ex.step_delay = Duration::from_millis(1);
    let plans = Arc::clone(&ex.plans);
    let cfg = SchedulerConfig {
        max_buffered_events: 8,
        ..config()
    };
    let handle = EngineLoop::spawn(cfg, ex).unwrap();
    let slow_prompt = prompt(1, 5);
    let (_, mut slow) = handle.submit(request(slow_prompt.clone(), 300)).unwrap();
    let fast_prompt = prompt(2, 6);
    let (_, mut fast) = handle.submit(request(fast_prompt.clone(), 40)).unwrap();
    let (tokens, end) = collect(&mut fast);
    assert_eq!(tokens, expected_tokens(&fast_prompt, 40));
    assert!(finished_with_length(end));
    // Stalled: 7 tokens made for the slow client, and no step runs while it waits.
    std::thread::sleep(Duration::from_millis(100));
    let steps = plans.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(plans.lock().unwrap().len(), steps, "the loop kept stepping");
    let m = handle.metrics();
    assert_eq!(m.generation_tokens_total, 40 + 7);
    assert_eq!(m.num_running, 1);
    // Reading lets it finish, with every token in order.
    let (tokens, end) = collect(&mut slow);
    assert_eq!(tokens, expected_tokens(&slow_prompt, 300));
    assert!(finished_with_length(end));
    handle.join().unwrap();
}

/// A stalled client that leaves is noticed at once, though nothing else runs.
#[test]
fn a_stalled_client_that_leaves_frees_its_blocks() {
    let ex = FakeExecutor::new(64, 4, 4096);
    let cfg = SchedulerConfig {
        max_buffered_events: 4,
        ..config()
    };
    let handle = EngineLoop::spawn(cfg, ex).unwrap();
    let (_, slow) = handle.submit(request(prompt(1, 5), 200)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while handle.metrics().generation_tokens_total < 3 {
        assert!(std::time::Instant::now() < deadline, "never ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(handle.metrics().kv_blocks_in_use > 0);
    drop(slow);
    while handle.metrics().kv_blocks_in_use > 0 {
        assert!(std::time::Instant::now() < deadline, "blocks never freed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(handle.metrics().generation_tokens_total, 3);
    handle.join().unwrap();
}
