//! Embedding sequences against transformers: the pooled final hidden states (last token,
//! mean, first token; unit length) of tiny random-weight Qwen3 and llama models, at TP = 1
//! and 2, each prompt prefilled in two chunks over two steps beside the others and a
//! generating sequence, within cosine 0.9999 of `fixtures/<model>/embeddings.json`.

mod common;

use common::*;
use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::{
    Executor, NewSequence, Pooling, PoolingKind, SamplingParams, ScheduledChunk, SeqId, StepPlan,
};

const BLOCKS_PER_SEQ: usize = 4;

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn chunk(id: u64, prompt: &[u32], from: usize, to: usize, sample: bool) -> ScheduledChunk {
    let first = id as u32 * BLOCKS_PER_SEQ as u32;
    ScheduledChunk {
        id: SeqId(id),
        tokens: prompt[from..to].to_vec(),
        start_pos: from,
        block_table: (first..first + BLOCKS_PER_SEQ as u32).collect(),
        sample,
        num_draft: 0,
        propose: 0,
        group_tables: Vec::new(),
    }
}

/// Embeddings of `prompts` pooled as `kind`: each prompt in two chunks over two steps,
/// with a generating sequence (id 0) in both steps.
fn embed(engine: &mut Engine, prompts: &[Vec<u32>], kind: PoolingKind) -> Vec<Vec<f32>> {
    let pooling = SamplingParams {
        pooling: Some(Pooling {
            kind,
            normalize: true,
        }),
        ..SamplingParams::greedy()
    };
    let generating = vec![5u32, 9, 11, 4];
    let mut new_sequences = vec![NewSequence {
        id: SeqId(0),
        sampling: SamplingParams::greedy(),
        prompt_ids: generating.clone(),
    }];
    let mut first = vec![chunk(0, &generating, 0, 2, false)];
    let mut second = vec![chunk(0, &generating, 2, 4, true)];
    for (i, p) in prompts.iter().enumerate() {
        let id = i as u64 + 1;
        new_sequences.push(NewSequence {
            id: SeqId(id),
            sampling: pooling.clone(),
            prompt_ids: p.clone(),
        });
        let half = p.len() / 2;
        if half > 0 {
            first.push(chunk(id, p, 0, half, false));
        }
        second.push(chunk(id, p, half, p.len(), true));
    }
    let step1 = StepPlan {
        new_sequences,
        scheduled: first,
        finished: vec![],
    };
    let out = engine.step(&step1).expect("first step");
    assert!(out.samples.is_empty() && out.failed.is_empty(), "{out:?}");
    let step2 = StepPlan {
        new_sequences: vec![],
        scheduled: second,
        finished: vec![],
    };
    let out = engine.step(&step2).expect("second step");
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert_eq!(out.samples.len(), prompts.len() + 1);
    assert_eq!(out.samples[0].id, SeqId(0));
    assert!(
        out.samples[0].embedding.is_none(),
        "a generating sequence samples a token"
    );
    let ids: Vec<u64> = (0..out.samples.len() as u64).collect();
    assert_eq!(out.samples.iter().map(|s| s.id.0).collect::<Vec<_>>(), ids);
    let finished = StepPlan {
        new_sequences: vec![],
        scheduled: vec![],
        finished: (0..=prompts.len() as u64).map(SeqId).collect(),
    };
    engine.step(&finished).expect("finish");
    out.samples[1..]
        .iter()
        .map(|s| s.embedding.clone().expect("an embedding"))
        .collect()
}

fn check(model: &str, tp: usize) {
    check_file(model, &fixtures().join(model), tp);
}

/// The embeddings of the model at `path` against the references of fixture `model`.
fn check_file(model: &str, path: &std::path::Path, tp: usize) {
    let reference = read_json(fixtures().join(model).join("embeddings.json"));
    let prompts: Vec<Vec<u32>> = reference["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(ids)
        .collect();
    let cfg = EngineConfig::new(path).with_cpu_ranks(tp);
    let mut engine = Engine::load(&cfg).expect("load");
    for (kind, name) in [
        (PoolingKind::Last, "last"),
        (PoolingKind::Mean, "mean"),
        (PoolingKind::Cls, "cls"),
    ] {
        let want: Vec<Vec<f32>> = reference["pooled"][name]
            .as_array()
            .expect("pooled")
            .iter()
            .map(floats)
            .collect();
        let got = embed(&mut engine, &prompts, kind);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let norm: f64 = g.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            assert!(
                (norm - 1.0).abs() < 1e-5,
                "{model} tp={tp} {name} #{i}: norm {norm}"
            );
            let cos = cosine(g, w);
            println!(
                "{model} tp={tp} {name} prompt of {}: cosine {cos:.7}",
                prompts[i].len()
            );
            assert!(cos >= 0.9999, "{model} tp={tp} {name} #{i}: cosine {cos}");
        }
        // The poolings differ (the check could not pass by one vector for all).
        if kind != PoolingKind::Last {
            let last = floats(&reference["pooled"]["last"][3]);
            assert!(
                cosine(&got[3], &last) < 0.99,
                "{model} {name} equals last pooling"
            );
        }
    }
}

#[test]
fn tiny_qwen3_embeddings_match_transformers_at_tp_1_and_2() {
    check("tiny-qwen3", 1);
    check("tiny-qwen3", 2);
}

/// The same weights in a GGUF file (f32): pooled from the GGUF reader's model.
#[test]
fn tiny_qwen3_gguf_embeddings_match_transformers() {
    check_file("tiny-qwen3", &fixtures().join("tiny-qwen3.gguf"), 1);
}

#[test]
fn tiny_llama_embeddings_match_transformers_at_tp_1_and_2() {
    check("tiny-llama", 1);
    check("tiny-llama", 2);
}
