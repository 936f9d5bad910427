//! CPU paged attention, one decode step of a batch: each sequence's new token attends
//! over its whole context through its block table. Shapes of Gemma 3 270M (4 query heads
//! on 1 KV head of 256) and SmolLM2-135M (9 on 3 of 64), 16 sequences of 190 positions
//! (`TESSERA_BENCH_CONTEXT` for another context), for each KV cache type, on the current
//! thread pool (`RAYON_NUM_THREADS`, default all cores).
//! Run: `cargo bench -p tessera-engine --bench attention`.

use std::time::Instant;

use tessera_engine::model::batch::{Batch, BatchSeq};
use tessera_engine::model::kv_cache::{KvCache, KvCacheDtype};
use tessera_engine::model::kv_write::write_kv;
use tessera_engine::model::paged_attention::{attend, query_groups, AttentionShape};

fn main() {
    let context: usize = std::env::var("TESSERA_BENCH_CONTEXT")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(190);
    println!(
        "| model shape | KV cache | sequences × context | time per layer, fastest of 9 rounds | positions·heads / s |"
    );
    println!("| --- | --- | --- | --- | --- |");
    let dtypes = [
        KvCacheDtype::F32,
        KvCacheDtype::Bf16,
        KvCacheDtype::Fp8E4m3,
        KvCacheDtype::Int8,
    ];
    for (name, nq, nkv, hd) in [("Gemma 3 270M", 4, 1, 256), ("SmolLM2-135M", 9, 3, 64)] {
        for dtype in dtypes {
            let (seqs, bs) = (16usize, 16usize);
            let blocks_per_seq = context.div_ceil(bs);
            let mut cache =
                KvCache::new(dtype, 1, seqs * blocks_per_seq, bs, nkv, hd).expect("cache");
            // Blocks interleaved across sequences, as a cache that served a while holds them.
            let table = |s: usize| -> Vec<u32> {
                (0..blocks_per_seq).map(|b| (b * seqs + s) as u32).collect()
            };
            let mut batch = Batch::default();
            for s in 0..seqs {
                let pos = context - 1;
                let t = table(s);
                batch.token_ids.push(0);
                batch.positions.push(pos);
                batch.slots.push(t[pos / bs] as usize * bs + pos % bs);
                batch.seqs.push(BatchSeq {
                    token_start: s,
                    num_tokens: 1,
                    start_pos: pos,
                    block_table: t,
                });
            }
            let mut layers = std::mem::take(&mut cache.layers);
            // Every position of every sequence written, as its prefill would.
            for s in 0..seqs {
                let t = table(s);
                let fill = Batch {
                    slots: (0..context)
                        .map(|p| t[p / bs] as usize * bs + p % bs)
                        .collect(),
                    ..Batch::default()
                };
                let k: Vec<f32> = (0..context * nkv * hd)
                    .map(|i| ((i % 97) as f32 * 0.01).sin())
                    .collect();
                let v: Vec<f32> = (0..context * nkv * hd)
                    .map(|i| ((i % 89) as f32 * 0.02).cos())
                    .collect();
                write_kv(&mut layers[0], &cache, &fill, &k, &v);
            }
            let q: Vec<f32> = (0..seqs * nq * hd)
                .map(|i| (i as f32 * 0.03).sin())
                .collect();
            let kv_of_q: Vec<usize> = (0..nq).map(|h| h / (nq / nkv)).collect();
            let groups = query_groups(&kv_of_q);
            let shape = AttentionShape {
                num_q_heads: nq,
                head_dim: hd,
                groups: &groups,
                scale: 0.0625,
                window: None,
                softcap: None,
                sinks: None,
            };
            let run = || std::hint::black_box(attend(&layers[0], &cache, &batch, &q, shape));
            run();
            // The fastest of several rounds: a shared 2-core machine's other work only
            // ever adds time.
            let (rounds, iters) = (9, 60);
            let mut times: Vec<f64> = (0..rounds)
                .map(|_| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        run();
                    }
                    start.elapsed().as_secs_f64() / iters as f64
                })
                .collect();
            times.sort_by(f64::total_cmp);
            let (t, median) = (times[0], times[rounds / 2]);
            println!(
                "| {name} ({nq} heads on {nkv} of {hd}) | {dtype} | {seqs} × {context} | {:.1} µs (median {:.1}) | {:.1} M |",
                t * 1e6,
                median * 1e6,
                (seqs * context * nq) as f64 / t / 1e6
            );
        }
    }
}
