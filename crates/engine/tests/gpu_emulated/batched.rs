//! Several sequences per step, as the scheduler batches them: prompts of different lengths
//! prefilled in chunks beside sequences that decode, each in blocks of its own, and the
//! blocks of finished sequences handed to later ones (stale keys and values must not
//! leak into their attention). The GPU path and the CPU engine get the same steps — the
//! CPU engine's greedy tokens are fed to both — and every sampled row is compared.

use std::path::Path;

use tessera_engine::model::batch::{Batch, ChunkLimits};
use tessera_engine::Engine;
use tessera_protocol::{Executor, KvCacheShape, ScheduledChunk, SeqId, StepPlan};

use crate::common::rel_l2;

struct Seq {
    id: u64,
    tokens: Vec<u32>,
    computed: usize,
    /// Per KV group (several with hybrid groups), the sequence's blocks.
    blocks: Vec<Vec<u32>>,
    to_generate: usize,
}

/// Prompt lengths and the step each sequence arrives at.
const ARRIVALS: [(usize, usize); 6] = [(45, 0), (3, 0), (120, 1), (17, 3), (64, 5), (9, 6)];
const GENERATED: usize = 6;
const CHUNK: usize = 16;

/// What the schedule compared.
pub struct Compared {
    /// Each sampled row's relative L2 distance to the CPU engine's.
    pub errors: Vec<f32>,
    /// Greedy choices the CPU engine made by a clear margin (0.1), and how many of them
    /// the GPU path made differently.
    pub choices: usize,
    pub differ: usize,
}

/// Runs the schedule on both engines.
pub fn run(path: &Path, gpu: &mut Engine, cpu: &mut Engine) -> Compared {
    let vocab = cpu.model_config().vocab_size;
    let bs = cpu.kv_cache_shape().block_size_tokens;
    let blocks = cpu
        .kv_cache_shape()
        .num_blocks
        .min(gpu.kv_cache_shape().num_blocks);
    let groups = cpu.kv_cache_shape().num_groups();
    let limits = ChunkLimits {
        kv: KvCacheShape {
            hybrid: cpu.kv_cache_shape().hybrid,
            ..KvCacheShape::new(blocks, bs)
        },
        max_positions: cpu.model_config().max_position_embeddings,
        vocab_rows: vocab,
    };
    // Freed blocks go to the front: the next sequence reuses them first.
    let mut free: Vec<u32> = (0..blocks as u32).rev().collect();
    let mut rng = tessera_kernels::gpu::reference::Lcg(41);
    let mut waiting: Vec<(usize, Seq)> = ARRIVALS
        .iter()
        .enumerate()
        .map(|(i, (len, at))| {
            let seq = Seq {
                id: i as u64 + 1,
                tokens: (0..*len).map(|_| rng.below(vocab) as u32).collect(),
                computed: 0,
                blocks: vec![Vec::new(); groups],
                to_generate: GENERATED,
            };
            (*at, seq)
        })
        .collect();
    let mut active: Vec<Seq> = Vec::new();
    let (mut errors, mut choices, mut differ) = (Vec::new(), 0, 0);
    for step in 0.. {
        let (now, later): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(at, _)| *at <= step);
        waiting = later;
        active.extend(now.into_iter().map(|(_, s)| s));
        if active.is_empty() && waiting.is_empty() {
            break;
        }
        let mut scheduled = Vec::new();
        for seq in &mut active {
            let end = (seq.computed + CHUNK).min(seq.tokens.len());
            while seq.blocks[0].len() * bs < end {
                for group in &mut seq.blocks {
                    group.push(
                        free.pop()
                            .unwrap_or_else(|| panic!("{}: blocks ran out", path.display())),
                    );
                }
            }
            scheduled.push(ScheduledChunk {
                id: SeqId(seq.id),
                tokens: seq.tokens[seq.computed..end].to_vec(),
                start_pos: seq.computed,
                block_table: seq.blocks[0].clone(),
                sample: end == seq.tokens.len(),
                num_draft: 0,
                propose: 0,
                group_tables: seq.blocks[1..].to_vec(),
            });
            seq.computed = end;
        }
        let plan = StepPlan {
            new_sequences: vec![],
            scheduled,
            finished: vec![],
        };
        let batch = Batch::from_plan(&plan, &limits).expect("batch");
        let want = cpu.forward(batch.clone()).expect("CPU step");
        let got = gpu.forward(batch).expect("GPU-path step");
        assert_eq!(want.len(), got.len());
        let sampled = plan.scheduled.iter().filter(|c| c.sample).map(|c| c.id);
        for (r, id) in sampled.enumerate() {
            let (w, g) = (
                &want[r * vocab..(r + 1) * vocab],
                &got[r * vocab..(r + 1) * vocab],
            );
            errors.push(rel_l2(g, w));
            let (best, gap) = top_two(w);
            if gap >= 0.1 {
                choices += 1;
                differ += usize::from(top_two(g).0 != best);
            }
            let seq = active
                .iter_mut()
                .find(|s| SeqId(s.id) == id)
                .expect("sequence");
            seq.tokens.push(best as u32);
            seq.to_generate -= 1;
        }
        active.retain_mut(|s| {
            if s.to_generate > 0 {
                return true;
            }
            for group in &mut s.blocks {
                free.extend(group.drain(..).rev());
            }
            false
        });
    }
    Compared {
        errors,
        choices,
        differ,
    }
}

/// The arg-max of `row` and its lead over the runner-up.
fn top_two(row: &[f32]) -> (usize, f32) {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|a, b| row[*b].total_cmp(&row[*a]).then(a.cmp(b)));
    (order[0], row[order[0]] - row[order[1]])
}
