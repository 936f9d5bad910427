//! The scheduler's engine loop over the real engine, without HTTP: greedy requests run
//! together, and the loop's metrics once it is idle.

use std::thread;
use std::time::{Duration, Instant};

use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::{
    FinishReason, GenerationRequest, SamplingParams, StopCondition, TokenEvent, TokenLogprobs,
};
use tessera_scheduler::{EngineLoop, SchedulerConfig, SchedulerHandle, SchedulerMetrics};

/// The real model the tests serve: `TESSERA_TEST_MODEL`, else the default model.
pub fn test_model() -> std::path::PathBuf {
    std::env::var("TESSERA_TEST_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| tessera_engine::default_model_path())
}

/// A greedy request for `max_tokens` tokens that never stops early.
pub fn greedy_request(prompt: &[u32], max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: prompt.to_vec(),
        sampling: SamplingParams::greedy(),
        stop: StopCondition {
            max_tokens,
            stop_token_ids: vec![],
            ignore_eos: true,
            request_stop_token_ids: Vec::new(),
        },
        cache_salt: None,
    }
}

/// Each prompt's tokens when sampled at temperature 0.8 and top-p 0.95 with the seeds
/// `first_seed`, `first_seed + 1`, ...: speculation must keep them draw for draw.
pub fn seeded_tokens(
    handle: &SchedulerHandle,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    first_seed: u64,
) -> Vec<Vec<u32>> {
    let requests: Vec<GenerationRequest> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = greedy_request(p, max_tokens);
            r.sampling = SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                seed: Some(first_seed + i as u64),
                ..SamplingParams::default()
            };
            r
        })
        .collect();
    stream_all(handle, &requests)
        .into_iter()
        .map(|s| s.0)
        .collect()
}

/// Loads `cfg` and runs the scheduler's engine loop over it, at most 16 sequences and
/// `max_batch_tokens` tokens a step.
pub fn spawn_loop(cfg: &EngineConfig, max_batch_tokens: usize) -> SchedulerHandle {
    spawn_loop_with(
        cfg,
        SchedulerConfig {
            max_batch_tokens,
            max_num_seqs: 16,
            ..SchedulerConfig::default()
        },
    )
}

/// Loads `cfg` and runs the scheduler's engine loop over it with `sched`.
pub fn spawn_loop_with(cfg: &EngineConfig, sched: SchedulerConfig) -> SchedulerHandle {
    let engine = Engine::load(cfg).expect("engine");
    EngineLoop::spawn(sched, engine).expect("engine loop")
}

/// What one request streamed: its tokens, each token's log-probabilities, and the
/// prompt's.
pub type Streamed = (
    Vec<u32>,
    Vec<Option<TokenLogprobs>>,
    Option<Vec<TokenLogprobs>>,
);

/// Runs every request at once; returns what each streamed. Each must end by its length,
/// with every token it reported.
pub fn stream_all(handle: &SchedulerHandle, requests: &[GenerationRequest]) -> Vec<Streamed> {
    let receivers: Vec<_> = requests
        .iter()
        .map(|r| handle.submit(r.clone()).expect("admitted").1)
        .collect();
    thread::scope(|s| {
        let joins: Vec<_> = receivers
            .into_iter()
            .map(|mut rx| {
                s.spawn(move || {
                    let mut out: Streamed = (Vec::new(), Vec::new(), None);
                    while let Some(ev) = rx.blocking_recv() {
                        match ev {
                            TokenEvent::Token {
                                token,
                                logprobs,
                                prompt_logprobs,
                            } => {
                                out.0.push(token);
                                out.1.push(logprobs);
                                if prompt_logprobs.is_some() {
                                    out.2 = prompt_logprobs;
                                }
                            }
                            TokenEvent::Finished {
                                reason,
                                completion_tokens,
                                ..
                            } => {
                                assert_eq!(reason, FinishReason::Length);
                                assert_eq!(completion_tokens, out.0.len());
                                break;
                            }
                            TokenEvent::Error(e)
                            | TokenEvent::Failed(e)
                            | TokenEvent::Refused(e) => {
                                panic!("engine error: {e}")
                            }
                            TokenEvent::Embedding(_) => panic!("an embedding for a generation"),
                        }
                    }
                    out
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("receiver thread"))
            .collect()
    })
}

/// Runs every prompt at once for `max_tokens` greedy tokens; returns each one's tokens.
pub fn run_concurrently(
    handle: &SchedulerHandle,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    let requests: Vec<_> = prompts
        .iter()
        .map(|p| greedy_request(p, max_tokens))
        .collect();
    stream_all(handle, &requests)
        .into_iter()
        .map(|s| s.0)
        .collect()
}

/// Runs each prompt alone, one after another, for `max_tokens` greedy tokens.
pub fn run_each_alone(
    handle: &SchedulerHandle,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| run_concurrently(handle, std::slice::from_ref(p), max_tokens).remove(0))
        .collect()
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
