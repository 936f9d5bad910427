//! Paged attention against the plain host reference on random inputs: every head
//! dimension, both KV dtypes, many block sizes, contexts that span many blocks and
//! partitions, sliding windows, other score scales, capped scores and attention sinks.

use candle_core::{Device, Tensor};
use tessera_engine::device::dtype::candle_dtype;
use tessera_engine::model::cuda::kernels::{paged_attention, HeadLayout, LayerAttention};
use tessera_engine::model::cuda::step_meta::StepMeta;
use tessera_engine::model::cuda::KvLayer;
use tessera_engine::model::step_meta::PackedMeta;
use tessera_kernels::gpu::launch::{KvDtype, HEAD_DIMS};
use tessera_kernels::gpu::reference::{self, AttentionInput};

use crate::kernels::{launcher, scattered_batch, TARGET_BLOCKS};
use crate::report::{check, download, gpu, rounded, upload, Lcg};
use tessera_kernels::gpu::reference::{max_row_relative_diff, SHARP_SCORES};

struct AttentionCase {
    dtype: KvDtype,
    head_dim: usize,
    num_q_heads: usize,
    num_kv_heads: usize,
    block_size: usize,
    seqs: Vec<(usize, usize)>,
    /// A sliding window: each token attends to its last `window` positions.
    window: Option<usize>,
    /// Score scale; `SHARP_SCORES/√head_dim` when `None` (peaked attention, so that a
    /// wrong merge of a split decode's partitions shows).
    scale: Option<f32>,
    /// Gemma 2's cap on scaled scores.
    softcap: Option<f32>,
    /// gpt-oss's sink logit of each query head.
    sinks: Option<Vec<f32>>,
}

/// Runs one case; returns (the largest error of an output row relative to the row's
/// size, partitions of the decode launch).
fn attention_case(c: &AttentionCase, device: &Device, rng: &mut Lcg) -> (f32, usize) {
    let (hd, nq, nkv, bs) = (c.head_dim, c.num_q_heads, c.num_kv_heads, c.block_size);
    let dt = candle_dtype(c.dtype);
    let (batch, steps, num_blocks) = scattered_batch(&c.seqs, bs, rng);
    let n = batch.num_tokens();
    let row = nkv * hd;
    let k = rounded(&rng.values(num_blocks * bs * row), dt);
    let v = rounded(&rng.values(num_blocks * bs * row), dt);
    let width = (nq + 2 * nkv) * hd;
    let qkv = rounded(&rng.values(n * width), dt);
    let shape = [num_blocks, bs, nkv, hd];
    let (k_dev, v_dev) = (
        upload(&k, &shape, dt, device),
        upload(&v, &shape, dt, device),
    );
    let qkv_dev = upload(&qkv, &[n, width], dt, device);
    let group = nq / nkv;
    let kv_of_q: Vec<u32> = (0..nq).map(|h| (h / group) as u32).collect();
    let packed = PackedMeta::new(&batch, &kv_of_q, TARGET_BLOCKS).expect("pack");
    let parts = packed.plan.decode.partitions;
    let meta = StepMeta::upload(packed, bs, device).expect("upload");
    let heads = HeadLayout {
        num_q_heads: nq,
        num_kv_heads: nkv,
        head_dim: hd,
    };
    let sinks = c
        .sinks
        .as_ref()
        .map(|s| Tensor::from_slice(s, s.len(), device).expect("sinks"));
    let out = paged_attention(
        launcher(device),
        c.dtype,
        &qkv_dev,
        KvLayer::plain(&k_dev, &v_dev),
        &meta,
        heads,
        LayerAttention {
            window: c.window,
            scale: c.scale.unwrap_or(SHARP_SCORES / (hd as f32).sqrt()),
            softcap: c.softcap,
            sinks: sinks.as_ref(),
        },
    )
    .expect("attention");
    let want = reference::attention(&AttentionInput {
        qkv: &qkv,
        k_cache: &k,
        v_cache: &v,
        seqs: &steps,
        num_q_heads: nq,
        num_kv_heads: nkv,
        head_dim: hd,
        block_size: bs,
        window: c.window,
        scale: c.scale.unwrap_or(SHARP_SCORES / (hd as f32).sqrt()),
        softcap: c.softcap,
        sinks: c.sinks.as_deref(),
    });
    (max_row_relative_diff(&download(&out), &want, hd), parts)
}

#[test]
fn paged_attention_matches_the_reference() {
    let device = gpu();
    let mut rng = Lcg(7);
    // Mixed batches: a prefill from scratch, a chunked prefill over cached blocks, a long
    // decode (split into partitions, since one token's heads cannot fill the GPU) and a
    // short one (with partitions beyond its context).
    let mixed = vec![(0, 37), (100, 21), (1500, 1), (5, 1)];
    for dtype in [KvDtype::Bf16, KvDtype::F16] {
        let bound = if dtype == KvDtype::Bf16 { 2e-2 } else { 4e-3 };
        for hd in HEAD_DIMS {
            for (nq, nkv, bs) in [(4, 2, 16), (6, 1, 7), (2, 2, 32)] {
                let case = AttentionCase {
                    dtype,
                    head_dim: hd,
                    num_q_heads: nq,
                    num_kv_heads: nkv,
                    block_size: bs,
                    seqs: mixed.clone(),
                    window: None,
                    scale: None,
                    softcap: None,
                    sinks: None,
                };
                let (err, parts) = attention_case(&case, &device, &mut rng);
                check(
                    &format!(
                        "attention {} hd{hd} {nq}q/{nkv}kv block {bs}, prefill+chunk+decode",
                        dtype.suffix()
                    ),
                    format!("max relative err {err:.2e} ({parts} decode partitions)"),
                    format!("< {bound:.0e}"),
                    err < bound && parts > 1,
                );
            }
        }
    }
}

#[test]
fn paged_attention_across_block_sizes_and_long_contexts() {
    let device = gpu();
    let mut rng = Lcg(11);
    for bs in [1, 8, 16, 32, 64, 128] {
        // Many decoding sequences (enough blocks: no partitions) with long contexts.
        let seqs: Vec<(usize, usize)> = (0..70).map(|i| (50 + 37 * i, 1)).collect();
        let case = AttentionCase {
            dtype: KvDtype::Bf16,
            head_dim: 128,
            num_q_heads: 4,
            num_kv_heads: 1,
            block_size: bs,
            seqs,
            window: None,
            scale: None,
            softcap: None,
            sinks: None,
        };
        let (err, parts) = attention_case(&case, &device, &mut rng);
        check(
            &format!("attention bf16 hd128 block {bs}, 70 decodes up to 2.6k context"),
            format!("max relative err {err:.2e} ({parts} partition)"),
            "< 2e-2".into(),
            err < 2e-2 && parts == 1,
        );
    }
    // One 4000-token context: 32 partitions; and a 700-token prefill chunk after 3000
    // cached tokens.
    for seqs in [vec![(3999, 1)], vec![(3000, 700)]] {
        let case = AttentionCase {
            dtype: KvDtype::Bf16,
            head_dim: 64,
            num_q_heads: 8,
            num_kv_heads: 2,
            block_size: 16,
            seqs: seqs.clone(),
            window: None,
            scale: None,
            softcap: None,
            sinks: None,
        };
        let (err, parts) = attention_case(&case, &device, &mut rng);
        check(
            &format!("attention bf16 hd64 block 16, sequence {seqs:?}"),
            format!("max relative err {err:.2e} ({parts} decode partitions)"),
            "< 2e-2".into(),
            err < 2e-2,
        );
    }
}

#[test]
fn paged_attention_honours_a_sliding_window() {
    let device = gpu();
    let mut rng = Lcg(13);
    // Windows shorter than a block, across blocks and chunks, and longer than some
    // contexts; over a prefill, a chunked prefill past the window, a decode split into
    // partitions that start at its window, and a short decode.
    let mixed = vec![(0, 37), (300, 21), (1500, 1), (5, 1)];
    for dtype in [KvDtype::Bf16, KvDtype::F16] {
        let bound = if dtype == KvDtype::Bf16 { 2e-2 } else { 4e-3 };
        for window in [1, 7, 100, 600] {
            for (hd, bs) in [(64, 16), (128, 7)] {
                let case = AttentionCase {
                    dtype,
                    head_dim: hd,
                    num_q_heads: 4,
                    num_kv_heads: 2,
                    block_size: bs,
                    seqs: mixed.clone(),
                    window: Some(window),
                    scale: Some(0.0625),
                    softcap: None,
                    sinks: None,
                };
                let (err, parts) = attention_case(&case, &device, &mut rng);
                check(
                    &format!(
                        "attention {} hd{hd} block {bs}, window {window}, prefill+chunk+decode",
                        dtype.suffix()
                    ),
                    format!("max relative err {err:.2e} ({parts} decode partitions)"),
                    format!("< {bound:.0e}"),
                    err < bound,
                );
            }
        }
    }
}

/// Gemma 2: scaled scores capped by `cap · tanh(s / cap)`, with and without a window.
#[test]
fn paged_attention_caps_scores() {
    let device = gpu();
    let mut rng = Lcg(19);
    let mixed = vec![(0, 37), (300, 21), (1500, 1), (5, 1)];
    for window in [None, Some(100)] {
        for (hd, cap) in [(64, 1.5), (256, 5.0)] {
            let case = AttentionCase {
                dtype: KvDtype::F16,
                head_dim: hd,
                num_q_heads: 4,
                num_kv_heads: 2,
                block_size: 16,
                seqs: mixed.clone(),
                window,
                scale: Some(0.5),
                softcap: Some(cap),
                sinks: None,
            };
            let (err, parts) = attention_case(&case, &device, &mut rng);
            check(
                &format!("attention f16 hd{hd}, score cap {cap}, window {window:?}"),
                format!("max relative err {err:.2e} ({parts} decode partitions)"),
                "< 4e-3".into(),
                err < 4e-3,
            );
        }
    }
}

/// gpt-oss: one sink logit per query head joins its softmax (some far above the scores,
/// some far below), with and without its window, over prefill tiles, a chunk after
/// cached blocks and split decodes.
#[test]
fn paged_attention_with_sinks() {
    let device = gpu();
    let mut rng = Lcg(29);
    let mixed = vec![(0, 37), (300, 21), (1500, 1), (5, 1)];
    for window in [None, Some(128)] {
        for (dtype, bound) in [(KvDtype::Bf16, 2e-2), (KvDtype::F16, 4e-3)] {
            let case = AttentionCase {
                dtype,
                head_dim: 64,
                num_q_heads: 6,
                num_kv_heads: 2,
                block_size: 16,
                seqs: mixed.clone(),
                window,
                scale: None,
                softcap: None,
                sinks: Some(vec![2.5, -1.0, 0.0, 6.0, -8.0, 0.5]),
            };
            let (err, parts) = attention_case(&case, &device, &mut rng);
            check(
                &format!(
                    "attention {} hd64, sinks, window {window:?}",
                    dtype.suffix()
                ),
                format!("max relative err {err:.2e} ({parts} decode partitions)"),
                format!("< {bound:.0e}"),
                err < bound && parts > 1,
            );
        }
    }
}
