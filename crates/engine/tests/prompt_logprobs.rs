//! Prompt log-probabilities (`SamplingParams::prompt_logprobs`) through the executor's
//! steps: a prompt prefilled in two chunks hands over, with its first token, the
//! log-probability of every prompt token after the first. Checked against the engine's
//! own logits at every position (one token per step), against transformers' arg-max at
//! every position (the tiny llama's reference), and at TP = 1 and 3.

mod common;

use common::*;
use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::{
    Executor, NewSequence, SamplingParams, ScheduledChunk, SeqId, StepPlan, TokenLogprobs,
};

/// The prompt's log-probabilities from steps of two chunks (`split` tokens, then the
/// rest), and the first token's own.
fn prompt_logprobs(
    engine: &mut Engine,
    prompt: &[u32],
    split: usize,
) -> (Vec<TokenLogprobs>, TokenLogprobs) {
    let id = SeqId(7);
    let sampling = SamplingParams {
        prompt_logprobs: Some(3),
        logprobs: Some(3),
        ..SamplingParams::greedy()
    };
    let table: Vec<u32> = (0..prompt.len().div_ceil(16) as u32 + 1).collect();
    let chunk = |start: usize, end: usize, sample| ScheduledChunk {
        id,
        tokens: prompt[start..end].to_vec(),
        start_pos: start,
        block_table: table.clone(),
        sample,
        num_draft: 0,
        propose: 0,
        group_tables: Vec::new(),
    };
    let first = engine
        .step(&StepPlan {
            new_sequences: vec![NewSequence {
                id,
                sampling,
                prompt_ids: prompt.to_vec(),
            }],
            scheduled: vec![chunk(0, split, false)],
            finished: vec![],
        })
        .expect("first chunk");
    assert!(first.samples.is_empty() && first.failed.is_empty());
    let out = engine
        .step(&StepPlan {
            new_sequences: vec![],
            scheduled: vec![chunk(split, prompt.len(), true)],
            finished: vec![],
        })
        .expect("second chunk");
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    let sample = out.samples.into_iter().next().expect("a sample");
    // The sequence ends; a later step hands nothing more over.
    engine
        .step(&StepPlan {
            finished: vec![id],
            ..StepPlan::default()
        })
        .expect("finish");
    (
        sample.prompt_logprobs.expect("prompt log-probabilities"),
        sample.logprobs.expect("the token's log-probabilities"),
    )
}

#[test]
fn prompt_logprobs_score_every_prompt_token_as_the_model_does() {
    let model = fixtures().join("tiny-llama");
    let reference = read_json(model.join("reference.json"));
    let mut results = Vec::new();
    for tp in [1, 3] {
        let mut engine = Engine::load(&EngineConfig::new(&model).with_cpu_ranks(tp)).expect("load");
        for case in reference["cases"].as_array().expect("cases") {
            let prompt = ids(&case["input_ids"]);
            let (lp, first) = prompt_logprobs(&mut engine, &prompt, prompt.len() / 2);
            assert_eq!(lp.len(), prompt.len() - 1);
            let every = logits_at_every_position(&mut engine, &prompt);
            let transformers_argmax = ids(&case["argmax_ids"]);
            for (i, got) in lp.iter().enumerate() {
                // Prompt token i + 1, scored by the logits at position i.
                let want = log_softmax(&every[i]);
                let token = prompt[i + 1] as usize;
                assert!(
                    (f64::from(got.logprob) - want[token]).abs() < 1e-4,
                    "tp {tp} position {}: {} against {}",
                    i + 1,
                    got.logprob,
                    want[token]
                );
                assert_eq!(got.top.len(), 3);
                assert_eq!(got.top[0].0, transformers_argmax[i], "tp {tp} position {i}");
                assert!((f64::from(got.top[0].1) - want[got.top[0].0 as usize]).abs() < 1e-4);
            }
            // The first token's own log-probability is that of the last position.
            let last = log_softmax(&every[prompt.len() - 1]);
            assert!((f64::from(first.logprob) - last[first.top[0].0 as usize]).abs() < 1e-4);
            results.push(lp);
        }
    }
    // TP = 3 scores as TP = 1.
    let (one, three) = results.split_at(results.len() / 2);
    for (a, b) in one.iter().zip(three) {
        for (x, y) in a.iter().zip(b) {
            assert!((x.logprob - y.logprob).abs() < 1e-4);
        }
    }
}
