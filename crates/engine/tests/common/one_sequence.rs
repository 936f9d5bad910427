//! Driving one sequence (`SeqId(1)`) through an engine's steps by hand: what a step asks
//! of it, its one sample, and its end. Shared by the MTP tests on CPU and on a GPU.

use tessera_engine::Engine;
use tessera_protocol::{Executor, SampledToken, ScheduledChunk, SeqId, StepPlan};

pub const SEQ: SeqId = SeqId(1);

/// The sequence's chunk of `tokens` from `start_pos`, whose last `num_draft` are guesses
/// to score, sampling and asking for `propose` guesses after it.
pub fn chunk(
    tokens: Vec<u32>,
    start_pos: usize,
    num_draft: usize,
    propose: usize,
    block_table: &[u32],
) -> ScheduledChunk {
    ScheduledChunk {
        id: SEQ,
        tokens,
        start_pos,
        block_table: block_table.to_vec(),
        sample: true,
        num_draft,
        propose,
        group_tables: Vec::new(),
    }
}

/// Runs `plan`, which schedules the sequence alone; its sample.
pub fn only_sample(engine: &mut Engine, plan: &StepPlan) -> SampledToken {
    let out = engine.step(plan).expect("step");
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert_eq!(out.samples.len(), 1);
    out.samples.into_iter().next().expect("a sample")
}

/// Ends the sequence: the next one starts afresh.
pub fn finish(engine: &mut Engine) {
    let done = StepPlan {
        finished: vec![SEQ],
        ..StepPlan::default()
    };
    engine.step(&done).expect("finish");
}
