//! The scheduler's engine loop over the real engine, without HTTP: greedy requests run
//! together, and the loop's metrics once it is idle.

use std::thread;
use std::time::{Duration, Instant};

use tessera_protocol::{
    FinishReason, GenerationRequest, SamplingParams, StopCondition, TokenEvent,
};
use tessera_scheduler::{SchedulerHandle, SchedulerMetrics};

/// A greedy request for `max_tokens` tokens that never stops early.
pub fn greedy_request(prompt: &[u32], max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: prompt.to_vec(),
        sampling: SamplingParams::greedy(),
        stop: StopCondition {
            max_tokens,
            stop_token_ids: vec![],
            ignore_eos: true,
        },
    }
}

/// Runs every prompt at once for `max_tokens` greedy tokens; returns each one's tokens.
/// Each must end by its length, with every token it reported.
pub fn run_concurrently(
    handle: &SchedulerHandle,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    let receivers: Vec<_> = prompts
        .iter()
        .map(|p| {
            handle
                .submit(greedy_request(p, max_tokens))
                .expect("admitted")
                .1
        })
        .collect();
    thread::scope(|s| {
        let joins: Vec<_> = receivers
            .into_iter()
            .map(|mut rx| {
                s.spawn(move || {
                    let mut tokens = Vec::new();
                    while let Some(ev) = rx.blocking_recv() {
                        match ev {
                            TokenEvent::Token { token, .. } => tokens.push(token),
                            TokenEvent::Finished {
                                reason,
                                completion_tokens,
                                ..
                            } => {
                                assert_eq!(reason, FinishReason::Length);
                                assert_eq!(completion_tokens, tokens.len());
                                break;
                            }
                            TokenEvent::Error(e) | TokenEvent::Failed(e) => {
                                panic!("engine error: {e}")
                            }
                        }
                    }
                    tokens
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("receiver thread"))
            .collect()
    })
}

/// Metrics are published after each step's events are sent: wait (bounded) for the
/// loop to go idle.
pub fn idle_metrics(handle: &SchedulerHandle) -> SchedulerMetrics {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = handle.metrics();
        if (m.num_running == 0 && m.num_waiting == 0) || Instant::now() > deadline {
            return m;
        }
        thread::sleep(Duration::from_millis(10));
    }
}
