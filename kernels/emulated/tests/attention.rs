//! The CUDA paged-attention kernels, run on CPU threads, against the host reference:
//! every head dimension, both 16-bit types, grouped queries, block sizes from 1 to 128,
//! prefill tiles, chunked prefill over cached blocks, decodes split into partitions and
//! merged, sliding windows, other score scales, capped scores (Gemma 2) and attention
//! sinks (gpt-oss). The step's
//! tables and tile plan come from the engine's own packing (`PackedMeta`).

mod common;

use common::{kv_of_q, rounded, to_f32, Step};
use half::{bf16, f16};
use tessera_kernels::gpu::launch::HEAD_DIMS;
use tessera_kernels::gpu::reference::{
    self, max_abs_diff, max_row_relative_diff, AttentionInput, Lcg, SHARP_SCORES,
};
use tessera_kernels_emulated::{paged_attention, Element, Heads, Scores};

struct Case {
    head_dim: usize,
    num_q_heads: usize,
    num_kv_heads: usize,
    block_size: usize,
    seqs: Vec<(usize, usize)>,
    window: Option<usize>,
    scale: Option<f32>,
    softcap: Option<f32>,
    sinks: Option<Vec<f32>>,
}

/// A case's step and random caches and queries, in the element type and as f32.
struct Inputs<T> {
    step: Step,
    heads: Heads,
    k: (Vec<T>, Vec<f32>),
    v: (Vec<T>, Vec<f32>),
    qkv: (Vec<T>, Vec<f32>),
}

fn inputs<T: Element>(c: &Case, rng: &mut Lcg) -> Inputs<T> {
    let (nq, nkv, bs) = (c.num_q_heads, c.num_kv_heads, c.block_size);
    let step = Step::new(&c.seqs, bs, &kv_of_q(nq, nkv), rng);
    let heads = Heads {
        num_q_heads: nq,
        num_kv_heads: nkv,
        head_dim: c.head_dim,
    };
    let cache = step.num_blocks * bs * nkv * c.head_dim;
    let k = rounded::<T>(&rng.values(cache));
    let v = rounded::<T>(&rng.values(cache));
    let qkv = rounded::<T>(&rng.values(step.num_tokens() * heads.qkv_width()));
    Inputs {
        step,
        heads,
        k,
        v,
        qkv,
    }
}

fn kernel<T: Element>(x: &Inputs<T>, scores: Scores<'_>) -> Vec<f32> {
    let got = paged_attention(&x.qkv.0, &x.k.0, &x.v.0, &x.step.tables(), x.heads, scores)
        .expect("the kernel runs");
    to_f32(&got)
}

fn host<T: Element>(x: &Inputs<T>, scores: Scores<'_>) -> Vec<f32> {
    reference::attention(&AttentionInput {
        qkv: &x.qkv.1,
        k_cache: &x.k.1,
        v_cache: &x.v.1,
        seqs: &x.step.seqs,
        num_q_heads: x.heads.num_q_heads,
        num_kv_heads: x.heads.num_kv_heads,
        head_dim: x.heads.head_dim,
        block_size: x.step.block_size,
        window: scores.window,
        scale: scores.scale,
        softcap: scores.softcap,
        sinks: scores.sinks,
    })
}

/// The largest error of any output row relative to that row's size, against the
/// reference, and the decode launch's partitions. Without a scale of its own a case's
/// scores are sharp (`SHARP_SCORES`), so that a wrong merge of partitions shows.
fn run<T: Element>(c: &Case, rng: &mut Lcg) -> (f32, usize) {
    let x = inputs::<T>(c, rng);
    let scores = Scores {
        scale: c.scale.unwrap_or(SHARP_SCORES / (c.head_dim as f32).sqrt()),
        window: c.window,
        softcap: c.softcap,
        sinks: c.sinks.as_deref(),
    };
    let err = max_row_relative_diff(&kernel(&x, scores), &host(&x, scores), c.head_dim);
    (err, x.step.meta.plan.decode.partitions)
}

/// A prefill from scratch, a chunked prefill over cached blocks, a long decode (split
/// into partitions: one token's heads cannot fill the GPU) and a short one.
fn mixed() -> Vec<(usize, usize)> {
    vec![(0, 37), (100, 21), (1500, 1), (5, 1)]
}

/// Output rounding to the element type bounds the error, relative to the row.
fn bound<T: Element>() -> f32 {
    match T::DTYPE {
        tessera_kernels::gpu::launch::KvDtype::Bf16 => 2e-2,
        tessera_kernels::gpu::launch::KvDtype::F16 => 4e-3,
    }
}

fn every_head_dim<T: Element>(seed: u64) {
    let mut rng = Lcg(seed);
    for hd in HEAD_DIMS {
        for (nq, nkv, bs) in [(4, 2, 16), (6, 1, 7), (2, 2, 32)] {
            let case = Case {
                head_dim: hd,
                num_q_heads: nq,
                num_kv_heads: nkv,
                block_size: bs,
                seqs: mixed(),
                window: None,
                scale: None,
                softcap: None,
                sinks: None,
            };
            let (err, parts) = run::<T>(&case, &mut rng);
            assert!(parts > 1, "the long decode is split");
            assert!(
                err < bound::<T>(),
                "hd{hd} {nq}q/{nkv}kv block {bs}: max relative err {err:.2e}"
            );
        }
    }
}

#[test]
fn bf16_every_head_dim_grouped_queries_and_block_sizes() {
    every_head_dim::<bf16>(7);
}

#[test]
fn f16_every_head_dim_grouped_queries_and_block_sizes() {
    every_head_dim::<f16>(8);
}

#[test]
fn block_sizes_from_one_to_128_over_long_contexts() {
    let mut rng = Lcg(11);
    for bs in [1, 8, 16, 32, 64, 128] {
        // Enough decoding sequences that the contexts are not split.
        let seqs: Vec<(usize, usize)> = (0..40).map(|i| (50 + 61 * i, 1)).collect();
        let case = Case {
            head_dim: 64,
            num_q_heads: 8,
            num_kv_heads: 1,
            block_size: bs,
            seqs,
            window: None,
            scale: None,
            softcap: None,
            sinks: None,
        };
        let (err, parts) = run::<bf16>(&case, &mut rng);
        assert_eq!(parts, 1);
        assert!(err < 2e-2, "block {bs}: max relative err {err:.2e}");
    }
    // One 4000-token context in 32 partitions; a 300-token chunk after 3000 cached.
    for seqs in [vec![(3999, 1)], vec![(3000, 300)]] {
        let case = Case {
            head_dim: 64,
            num_q_heads: 4,
            num_kv_heads: 2,
            block_size: 16,
            seqs: seqs.clone(),
            window: None,
            scale: None,
            softcap: None,
            sinks: None,
        };
        let (err, _) = run::<bf16>(&case, &mut rng);
        assert!(err < 2e-2, "{seqs:?}: max relative err {err:.2e}");
    }
}

#[test]
fn sliding_windows_and_other_scales() {
    let mut rng = Lcg(13);
    // Windows shorter than a block, across blocks and chunks, longer than some contexts;
    // over a prefill, a chunk past the window, a split decode whose partitions start at
    // its window, and a short decode.
    let seqs = vec![(0, 37), (300, 21), (1500, 1), (5, 1)];
    for window in [1, 7, 100, 600] {
        for (hd, bs) in [(64, 16), (128, 7)] {
            let case = Case {
                head_dim: hd,
                num_q_heads: 4,
                num_kv_heads: 2,
                block_size: bs,
                seqs: seqs.clone(),
                window: Some(window),
                scale: Some(0.0625),
                softcap: None,
                sinks: None,
            };
            let (err, _) = run::<f16>(&case, &mut rng);
            assert!(
                err < 4e-3,
                "window {window} hd{hd} block {bs}: max relative err {err:.2e}"
            );
        }
    }
}

/// Gemma 2's capped scores, with and without its alternating window; scores scaled up
/// so that the cap bends them.
#[test]
fn capped_scores() {
    let mut rng = Lcg(19);
    let seqs = vec![(0, 37), (300, 21), (1500, 1), (5, 1)];
    for window in [None, Some(100)] {
        for (hd, cap) in [(64, 1.5), (256, 5.0)] {
            let case = Case {
                head_dim: hd,
                num_q_heads: 4,
                num_kv_heads: 2,
                block_size: 16,
                seqs: seqs.clone(),
                window,
                scale: Some(0.5),
                softcap: Some(cap),
                sinks: None,
            };
            let (err, _) = run::<f16>(&case, &mut rng);
            assert!(
                err < 4e-3,
                "window {window:?} hd{hd} cap {cap}: max relative err {err:.2e}"
            );
        }
    }
}

/// gpt-oss's sinks: with and without its alternating window, over prefill tiles, a chunk
/// after cached blocks and split decodes (the merge adds the sink once); some sinks far
/// above the scores (most weight to nothing), some far below (no effect).
#[test]
fn attention_sinks() {
    let mut rng = Lcg(29);
    let seqs = vec![(0, 37), (300, 21), (1500, 1), (5, 1)];
    let sinks = vec![2.5, -1.0, 0.0, 6.0, -8.0, 0.5];
    for window in [None, Some(128)] {
        for (hd, bs) in [(64, 16), (128, 7)] {
            let case = Case {
                head_dim: hd,
                num_q_heads: 6,
                num_kv_heads: 2,
                block_size: bs,
                seqs: seqs.clone(),
                window,
                scale: None,
                softcap: None,
                sinks: Some(sinks.clone()),
            };
            let (err, parts) = run::<f16>(&case, &mut rng);
            assert!(parts > 1, "the long decode is split");
            assert!(
                err < 4e-3,
                "window {window:?} hd{hd} block {bs}: max relative err {err:.2e}"
            );
        }
    }
    // Without the sinks, or with each counted twice, the outputs are far off.
    let case = Case {
        head_dim: 64,
        num_q_heads: 6,
        num_kv_heads: 2,
        block_size: 16,
        seqs,
        window: None,
        scale: None,
        softcap: None,
        sinks: None,
    };
    let x = inputs::<f16>(&case, &mut rng);
    let scores = |sinks| Scores {
        scale: 0.125,
        window: None,
        softcap: None,
        sinks,
    };
    let got = kernel(&x, scores(Some(&sinks)));
    assert!(max_abs_diff(&got, &host(&x, scores(Some(&sinks)))) < 2e-3);
    assert!(max_abs_diff(&got, &host(&x, scores(None))) > 0.05);
    let doubled: Vec<f32> = sinks.iter().map(|s| s + std::f32::consts::LN_2).collect();
    assert!(max_abs_diff(&got, &host(&x, scores(Some(&doubled)))) > 0.02);
}

#[test]
fn the_checks_can_fail() {
    // A kernel that ignored the window, or masked one position too many, or ignored the
    // cap, would be far outside the bound the tests above hold it to.
    let mut rng = Lcg(17);
    let case = Case {
        head_dim: 64,
        num_q_heads: 2,
        num_kv_heads: 1,
        block_size: 16,
        seqs: vec![(200, 1), (0, 40)],
        window: Some(8),
        scale: Some(1.0),
        softcap: None,
        sinks: None,
    };
    let x = inputs::<f16>(&case, &mut rng);
    let scores = |window, softcap| Scores {
        scale: 1.0,
        window,
        softcap,
        sinks: None,
    };
    let got = kernel(&x, scores(Some(8), None));
    assert!(max_abs_diff(&got, &host(&x, scores(Some(8), None))) < 2e-3);
    assert!(max_abs_diff(&got, &host(&x, scores(None, None))) > 0.05);
    assert!(max_abs_diff(&got, &host(&x, scores(Some(7), None))) > 0.05);
    assert!(max_abs_diff(&got, &host(&x, scores(Some(9), None))) > 0.05);
    let capped = kernel(&x, scores(Some(8), Some(1.0)));
    assert!(max_abs_diff(&capped, &host(&x, scores(Some(8), Some(1.0)))) < 2e-3);
    assert!(max_abs_diff(&capped, &host(&x, scores(Some(8), None))) > 0.05);
}
