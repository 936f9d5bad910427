//! The paged attention against a plain reference, for every cache type.

use super::*;
use crate::model::batch::BatchSeq;
use crate::model::kv_cache::KvCacheDtype;
use crate::model::kv_write::write_kv;

/// Reference: plain softmax attention over contiguous K/V, scores capped where
/// `softcap` is set, a `sink` logit in the softmax where one is given.
fn reference(
    q: &[f32],
    k: &[Vec<f32>],
    v: &[Vec<f32>],
    scale: f32,
    (softcap, sink): (Option<f32>, Option<f32>),
) -> Vec<f32> {
    let s: Vec<f32> = k
        .iter()
        .map(|kk| q.iter().zip(kk).map(|(a, b)| a * b).sum::<f32>() * scale)
        .map(|x| softcap.map_or(x, |cap| cap * (x / cap).tanh()))
        .collect();
    let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let m = sink.map_or(m, |x| m.max(x));
    let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f32 = e.iter().sum::<f32>() + sink.map_or(0.0, |x| (x - m).exp());
    (0..q.len())
        .map(|d| e.iter().zip(v).map(|(p, vv)| p * vv[d]).sum::<f32>() / z)
        .collect()
}

#[test]
fn query_groups_collect_the_heads_of_each_kv_head_in_order() {
    let g = query_groups(&[1, 0, 1, 0, 2]);
    let heads: Vec<(usize, Vec<usize>)> = g.into_iter().map(|g| (g.kv_head, g.heads)).collect();
    assert_eq!(heads, vec![(0, vec![1, 3]), (1, vec![0, 2]), (2, vec![4])]);
}

#[test]
fn scattered_blocks_give_the_same_result_as_contiguous_attention() {
    // Small sizes take the general loops; heads of 64, 128 and 256 in blocks of 16
    // the register-resident ones.
    for (hd, bs) in [(8, 4), (64, KEY_LANES), (128, KEY_LANES), (256, KEY_LANES)] {
        scattered_blocks_case(KvCacheDtype::F32, hd, bs, None, None);
    }
}

/// Every cache type is attended as the values it holds: each block of keys and each
/// value decoded with its own scale.
#[test]
fn every_cache_type_attends_to_what_it_holds() {
    for dtype in [
        KvCacheDtype::Bf16,
        KvCacheDtype::F16,
        KvCacheDtype::Fp8E4m3,
        KvCacheDtype::Int8,
    ] {
        for (hd, bs) in [(8, 4), (64, KEY_LANES)] {
            scattered_blocks_case(dtype, hd, bs, None, None);
        }
    }
}

/// gpt-oss's sinks: a logit per query head that joins each softmax, large enough for
/// some heads to take most of the weight and small for others.
#[test]
fn sinks_take_their_share_of_the_softmax() {
    let sinks = [2.5f32, -1.0, 0.0, 4.0, 0.5, -3.0, 1.5, 3.0, -0.5];
    for (hd, bs) in [(8, 4), (64, KEY_LANES)] {
        scattered_blocks_case(KvCacheDtype::F32, hd, bs, None, Some(&sinks));
    }
}

/// Gemma 2's capped scores (a cap low enough to bend most of them).
#[test]
fn capped_scores_match_the_reference() {
    for (hd, bs) in [(8, 4), (64, KEY_LANES)] {
        scattered_blocks_case(KvCacheDtype::F32, hd, bs, Some(0.5), None);
    }
}

fn scattered_blocks_case(
    dtype: KvCacheDtype,
    hd: usize,
    bs: usize,
    softcap: Option<f32>,
    sinks: Option<&[f32]>,
) {
    let nkv = 3;
    let mut cache = KvCache::new(dtype, 1, 8, bs, nkv, hd).expect("cache");
    // A sequence stored in blocks 5, 1, 6, 2, 7, 0 (out of order on purpose), the last
    // partly: longer than one run of CHUNK_BLOCKS blocks, so later tokens' results
    // are merged from two runs.
    let table = vec![5u32, 1, 6, 2, 7, 0];
    let n = 5 * bs + bs / 2;
    assert!(n > CHUNK_BLOCKS * bs);
    let val = |t: usize, h: usize, d: usize, w: f32| ((t * 31 + h * 7 + d * 3) as f32 * w).sin();
    let k: Vec<f32> = (0..n)
        .flat_map(|t| (0..nkv).flat_map(move |h| (0..hd).map(move |d| val(t, h, d, 0.37))))
        .collect();
    let v: Vec<f32> = (0..n)
        .flat_map(|t| (0..nkv).flat_map(move |h| (0..hd).map(move |d| val(t, h, d, 0.11))))
        .collect();
    let batch = Batch {
        token_ids: vec![0; n],
        positions: (0..n).collect(),
        slots: (0..n)
            .map(|p| table[p / bs] as usize * bs + p % bs)
            .collect(),
        seqs: vec![BatchSeq {
            token_start: 0,
            num_tokens: n,
            start_pos: 0,
            block_table: table.clone(),
        }],
        sample_rows: vec![n - 1],
        row_reduce: vec![],
        pool: vec![],
        groups: vec![],
    };
    let mut layer = std::mem::take(&mut cache.layers);
    write_kv(&mut layer[0], &cache, &batch, &k, &v);
    // The reference attends to what the cache holds.
    let (mut k, mut v) = (k, v);
    for (p, &slot) in batch.slots.iter().enumerate() {
        for h in 0..nkv {
            let (ks, vs) = cache.read(&layer[0], slot, h);
            let o = (p * nkv + h) * hd;
            k[o..o + hd].copy_from_slice(&ks);
            v[o..o + hd].copy_from_slice(&vs);
        }
    }
    // Groups of five, three and one query heads: the loops over heads take four at a
    // time, then what is left.
    let kv_of_q = [0, 0, 0, 0, 0, 1, 1, 1, 2];
    let nq = kv_of_q.len();
    let q: Vec<f32> = (0..n * nq * hd).map(|i| (i as f32 * 0.05).cos()).collect();
    let out = attend(
        &layer[0],
        &cache,
        &batch,
        &q,
        AttentionShape {
            num_q_heads: nq,
            head_dim: hd,
            groups: &query_groups(&kv_of_q),
            scale: 0.35,
            window: None,
            softcap,
            sinks,
        },
    );
    let mut moved = 0f32;
    for t in 0..n {
        for h in 0..nq {
            let kvh = kv_of_q[h];
            let ks: Vec<Vec<f32>> = (0..=t)
                .map(|p| k[(p * nkv + kvh) * hd..(p * nkv + kvh + 1) * hd].to_vec())
                .collect();
            let vs: Vec<Vec<f32>> = (0..=t)
                .map(|p| v[(p * nkv + kvh) * hd..(p * nkv + kvh + 1) * hd].to_vec())
                .collect();
            let q = &q[(t * nq + h) * hd..(t * nq + h + 1) * hd];
            let sink = sinks.map(|s| s[h]);
            let want = reference(q, &ks, &vs, 0.35, (softcap, sink));
            let plain = reference(q, &ks, &vs, 0.35, (None, None));
            moved = want
                .iter()
                .zip(&plain)
                .fold(moved, |m, (a, b)| m.max((a - b).abs()));
            let got = &out[(t * nq + h) * hd..(t * nq + h + 1) * hd];
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{dtype} t={t} h={h}: {a} vs {b}");
            }
        }
    }
    // The cap and the sinks change the result.
    let plain = softcap.is_none() && sinks.is_none();
    assert!(plain || moved > 1e-2, "{moved}");
}
