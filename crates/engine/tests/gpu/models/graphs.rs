//! Decode steps replayed from CUDA graphs on `cuda:0` against the same engine run eagerly
//! (`EngineConfig::decode_graphs`): for batches of 1, 2, 3, 5 and 8 sequences (every
//! bucket up to 8, padded or not), each decoding step's logits from the replayed graph
//! against the eager step's, and the greedy tokens alike. The graphs must have been
//! recorded and replayed (the rank's count of replayed steps).

use std::path::Path;

use tessera_engine::model::batch::{Batch, ChunkLimits};
use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::{Executor, KvCacheShape, ScheduledChunk, SeqId, StepPlan};

use super::{devices, models_dir, selected};
use crate::common::rel_l2;
use crate::report::check;

/// cuBLAS may pick another kernel for a padded batch's row count: bf16 rounding apart.
const GRAPH_BOUND: f32 = 5e-3;
const DECODE_STEPS: usize = 4;

fn engine(path: &Path, graphs: bool) -> Engine {
    let mut cfg = EngineConfig::new(path);
    cfg.devices = devices("cuda:0");
    cfg.kv_cache_bytes = 64 << 20;
    cfg.max_num_seqs = 8;
    cfg.decode_graphs = graphs;
    cfg.hybrid_kv_cache = false;
    Engine::load(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `n` sequences prefilled together, then decoded together for [`DECODE_STEPS`] steps
/// on both engines (the eager engine's greedy tokens fed to both): the worst decode
/// row's distance and how many greedy choices differ.
fn compare(replayed: &mut Engine, eager: &mut Engine, n: usize) -> (f32, usize) {
    let vocab = eager.model_config().vocab_size;
    let bs = eager.kv_cache_shape().block_size_tokens;
    let limits = ChunkLimits {
        kv: KvCacheShape::new(replayed.kv_cache_shape().num_blocks, bs),
        max_positions: eager.model_config().max_position_embeddings,
        vocab_rows: vocab,
    };
    let mut rng = tessera_kernels::gpu::reference::Lcg(n as u64 + 3);
    let mut seqs: Vec<(Vec<u32>, Vec<u32>, usize)> = (0..n)
        .map(|i| {
            let len = 3 + 29 * i;
            let tokens: Vec<u32> = (0..len).map(|_| rng.below(vocab) as u32).collect();
            let per = (len + DECODE_STEPS + 1).div_ceil(bs);
            let blocks = ((i * per) as u32..((i + 1) * per) as u32).collect();
            (tokens, blocks, 0)
        })
        .collect();
    let (mut worst, mut differ) = (0f32, 0);
    for step in 0..=DECODE_STEPS {
        let scheduled = seqs
            .iter()
            .enumerate()
            .map(|(i, (tokens, blocks, computed))| ScheduledChunk {
                id: SeqId(i as u64 + 1),
                tokens: tokens[*computed..].to_vec(),
                start_pos: *computed,
                block_table: blocks.clone(),
                sample: true,
                num_draft: 0,
                propose: 0,
                group_tables: Vec::new(),
            })
            .collect();
        let plan = StepPlan {
            new_sequences: vec![],
            scheduled,
            finished: vec![],
        };
        let batch = Batch::from_plan(&plan, &limits).expect("batch");
        let want = eager.forward(batch.clone()).expect("eager step");
        let got = replayed.forward(batch).expect("replayed step");
        for (i, (tokens, _, computed)) in seqs.iter_mut().enumerate() {
            let (w, g) = (&want[i * vocab..][..vocab], &got[i * vocab..][..vocab]);
            if step > 0 {
                worst = worst.max(rel_l2(g, w));
                differ += usize::from(argmax(g) != argmax(w));
            }
            *computed = tokens.len();
            tokens.push(argmax(w) as u32);
        }
    }
    (worst, differ)
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len())
        .max_by(|a, b| row[*a].total_cmp(&row[*b]).then(b.cmp(a)))
        .unwrap_or(0)
}

#[test]
fn cuda_graph_replays_give_the_eager_logits() {
    // Qwen3-MoE: routed on the device, graphs up to 8 rows.
    for name in ["llama", "qwen2", "gemma3", "qwen3-moe"] {
        if !selected(name) {
            continue;
        }
        let path = models_dir().join(name);
        let mut eager = engine(&path, false);
        let started = std::time::Instant::now();
        let mut replayed = engine(&path, true);
        let load = started.elapsed().as_secs_f64();
        for n in [1, 2, 3, 5, 8] {
            let before = replayed.stats().snapshot()[0].graph_steps;
            let (worst, differ) = compare(&mut replayed, &mut eager, n);
            let replays = replayed.stats().snapshot()[0].graph_steps - before;
            check(
                &format!("{name} bf16: {n} sequences decoded from CUDA graphs against eager"),
                format!(
                    "{replays} steps replayed; worst row rel L2 {worst:.2e}; {differ} greedy \
                     choices differ (load with graphs {load:.1}s)"
                ),
                format!("{DECODE_STEPS} replayed, < {GRAPH_BOUND:.0e}, 0 differ"),
                replays == DECODE_STEPS as u64 && worst < GRAPH_BOUND && differ == 0,
            );
        }
    }
}
