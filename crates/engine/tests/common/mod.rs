//! Shared by the engine's integration tests: where the models and fixtures are.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;
use tessera_engine::model::{Batch, ChunkLimits};
use tessera_engine::Engine;
use tessera_protocol::{ScheduledChunk, SeqId, StepPlan};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/models")
}

/// The default model, as `scripts/fetch-model` places it. Tests fail (never skip) when it
/// is missing: `scripts/test` fetches it first.
pub fn smollm2_path() -> PathBuf {
    let p = std::env::var("TESSERA_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| tessera_engine::default_model_path());
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-model",
        p.display()
    );
    p
}

pub fn read_json(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("not an id: {x}")) as u32)
        .collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap_or_else(|| panic!("not a number: {x}")) as f32)
        .collect()
}

pub fn read_f32(path: PathBuf) -> Vec<f32> {
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Relative L2 error of `a` against the reference `b`.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

pub fn top_k(v: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..v.len() as u32).collect();
    idx.sort_by(|a, b| v[*b as usize].total_cmp(&v[*a as usize]).then(a.cmp(b)));
    idx.truncate(k);
    idx
}

/// Last-position logits of `prompt`, computed in one step into blocks 0, 1, ...
pub fn last_logits(engine: &mut Engine, prompt: &[u32]) -> Vec<f32> {
    let plan = StepPlan {
        new_sequences: vec![],
        scheduled: vec![ScheduledChunk {
            id: SeqId(1),
            tokens: prompt.to_vec(),
            start_pos: 0,
            block_table: (0..prompt.len().div_ceil(16) as u32).collect(),
            sample: true,
        }],
        finished: vec![],
    };
    let config = engine.model_config();
    let limits = ChunkLimits {
        block_size: 16,
        num_blocks: prompt.len().div_ceil(16),
        max_positions: config.max_position_embeddings,
        vocab_rows: config.vocab_size,
    };
    let batch = Batch::from_plan(&plan, &limits).expect("batch");
    engine.forward(batch).expect("forward")
}
