//! Embedding sequences through an engine's steps, for the embedding checks on CPU ranks,
//! emulated GPU ranks and GPUs.

use tessera_engine::Engine;
use tessera_protocol::{
    Executor, NewSequence, Pooling, PoolingKind, SamplingParams, ScheduledChunk, SeqId, StepPlan,
};

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Chunk `from..to` of sequence `id`'s prompt; sequence `id` owns blocks
/// `id * per_seq .. (id + 1) * per_seq`.
fn chunk(
    id: u64,
    per_seq: usize,
    prompt: &[u32],
    from: usize,
    to: usize,
    sample: bool,
) -> ScheduledChunk {
    let first = (id as usize * per_seq) as u32;
    ScheduledChunk {
        id: SeqId(id),
        tokens: prompt[from..to].to_vec(),
        start_pos: from,
        block_table: (first..first + per_seq as u32).collect(),
        sample,
        num_draft: 0,
        propose: 0,
        group_tables: Vec::new(),
    }
}

/// Embeddings of `prompts` pooled as `kind` (unit length): each prompt in two chunks over two steps,
/// with a generating sequence (id 0) in both steps.
pub fn embed(engine: &mut Engine, prompts: &[Vec<u32>], kind: PoolingKind) -> Vec<Vec<f32>> {
    let pooling = SamplingParams {
        pooling: Some(Pooling {
            kind,
            normalize: true,
        }),
        ..SamplingParams::greedy()
    };
    let generating = vec![5u32, 9, 11, 4];
    let block = engine.kv_cache_shape().block_size_tokens;
    let longest = prompts
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(0)
        .max(generating.len());
    let per_seq = longest.div_ceil(block);
    let mut new_sequences = vec![NewSequence {
        id: SeqId(0),
        sampling: SamplingParams::greedy(),
        prompt_ids: generating.clone(),
    }];
    let mut first = vec![chunk(0, per_seq, &generating, 0, 2, false)];
    let mut second = vec![chunk(0, per_seq, &generating, 2, 4, true)];
    for (i, p) in prompts.iter().enumerate() {
        let id = i as u64 + 1;
        new_sequences.push(NewSequence {
            id: SeqId(id),
            sampling: pooling.clone(),
            prompt_ids: p.clone(),
        });
        let half = p.len() / 2;
        if half > 0 {
            first.push(chunk(id, per_seq, p, 0, half, false));
        }
        second.push(chunk(id, per_seq, p, half, p.len(), true));
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
