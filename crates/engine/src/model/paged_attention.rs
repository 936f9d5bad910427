//! Causal attention that reads K/V through block tables (CPU).
//!
//! Keys and values of a sequence are never gathered into a contiguous copy: for each
//! query token and head the kernel walks the sequence's block table. New tokens' K/V are
//! written to their slots before attention runs, so prefill chunks, decodes and mixes of
//! both take the same path.

use rayon::prelude::*;

use crate::model::batch::Batch;
use crate::model::kv_cache::{KvCache, LayerCache};

/// Writes the new tokens' keys and values (rows of `num_kv_heads * head_dim`) to their
/// slots.
pub fn write_kv(layer: &mut LayerCache, cache: &KvCache, batch: &Batch, k: &[f32], v: &[f32]) {
    let stride = cache.slot_stride();
    for (t, &slot) in batch.slots.iter().enumerate() {
        let dst = slot * stride..(slot + 1) * stride;
        layer.k[dst.clone()].copy_from_slice(&k[t * stride..(t + 1) * stride]);
        layer.v[dst].copy_from_slice(&v[t * stride..(t + 1) * stride]);
    }
}

/// Geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape<'a> {
    pub num_q_heads: usize,
    pub head_dim: usize,
    /// For each local query head, its local KV head.
    pub kv_of_q: &'a [usize],
    pub scale: f32,
}

/// `q`: `[tokens, num_q_heads * head_dim]` (rotated); returns the same shape.
///
/// Every (token, query head) is an independent task, so a single decoding token still
/// spreads its heads over the rank's threads.
pub fn attend(
    layer: &LayerCache,
    cache: &KvCache,
    batch: &Batch,
    q: &[f32],
    shape: AttentionShape<'_>,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let nq = shape.num_q_heads;
    let mut out = vec![0f32; batch.num_tokens() * nq * hd];
    // Token -> sequence lookup, so each output row is an independent task.
    let mut seq_of_token = Vec::with_capacity(batch.num_tokens());
    for (s, seq) in batch.seqs.iter().enumerate() {
        seq_of_token.extend(std::iter::repeat_n(s, seq.num_tokens));
    }
    let simd = Simd::detect();
    out.par_chunks_mut(hd)
        .enumerate()
        .for_each_init(Vec::new, |scores, (task, out_head)| {
            let (t, h) = (task / nq, task % nq);
            let seq = &batch.seqs[seq_of_token[t]];
            let context = batch.positions[t] + 1;
            scores.resize(context, 0.0);
            let head = Head {
                layer,
                cache,
                block_table: &seq.block_table,
                kv_head: shape.kv_of_q[h],
                q: &q[(t * nq + h) * hd..(t * nq + h + 1) * hd],
                scale: shape.scale,
            };
            simd.attend_one(&head, scores, out_head);
        });
    out
}

/// One query head against its KV head over a sequence's blocks.
struct Head<'a> {
    layer: &'a LayerCache,
    cache: &'a KvCache,
    block_table: &'a [u32],
    kv_head: usize,
    q: &'a [f32],
    scale: f32,
}

/// The widest vector instructions the attention loops are compiled for on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Simd {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Simd {
    fn detect() -> Self {
        static SIMD: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *SIMD.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
                return Simd::Avx512;
            }
            Simd::Baseline
        })
    }

    fn attend_one(self, head: &Head<'_>, scores: &mut [f32], out: &mut [f32]) {
        match self {
            // SAFETY: `Avx512` is only detected on CPUs with AVX-512F and FMA.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => unsafe { attend_one_avx512(head, scores, out) },
            Simd::Baseline => attend_one(head, scores, out),
        }
    }
}

/// [`attend_one`] compiled for AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn attend_one_avx512(head: &Head<'_>, scores: &mut [f32], out: &mut [f32]) {
    attend_one(head, scores, out);
}

/// Softmax(q·K × scale)·V for one head; `scores` holds one value per context position.
#[inline(always)]
fn attend_one(head: &Head<'_>, scores: &mut [f32], out: &mut [f32]) {
    let cache = head.cache;
    let hd = cache.head_dim;
    let bs = cache.block_size;
    let stride = cache.slot_stride();
    let offset = |pos: usize| {
        let slot = head.block_table[pos / bs] as usize * bs + pos % bs;
        slot * stride + head.kv_head * hd
    };
    let mut max = f32::NEG_INFINITY;
    for (pos, s) in scores.iter_mut().enumerate() {
        let o = offset(pos);
        *s = dot(head.q, &head.layer.k[o..o + hd]) * head.scale;
        max = max.max(*s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.iter_mut().for_each(|x| *x = 0.0);
    for (pos, p) in scores.iter().enumerate() {
        let o = offset(pos);
        for (acc, v) in out.iter_mut().zip(&head.layer.v[o..o + hd]) {
            *acc += p * v;
        }
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|x| *x *= inv);
}

/// Dot product in 16 independent lanes so the compiler vectorizes it.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let chunks = a.len() / LANES;
    for (ca, cb) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for l in 0..LANES {
            lanes[l] += ca[l] * cb[l];
        }
    }
    let mut sum: f32 = lanes.iter().sum();
    for i in chunks * LANES..a.len().min(b.len()) {
        sum += a[i] * b[i];
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::batch::BatchSeq;

    /// Reference: plain softmax attention over contiguous K/V.
    fn reference(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32) -> Vec<f32> {
        let s: Vec<f32> = k
            .iter()
            .map(|kk| q.iter().zip(kk).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = e.iter().sum();
        (0..q.len())
            .map(|d| e.iter().zip(v).map(|(p, vv)| p * vv[d]).sum::<f32>() / z)
            .collect()
    }

    #[test]
    fn scattered_blocks_give_the_same_result_as_contiguous_attention() {
        let (hd, bs, nkv) = (8, 4, 2);
        let mut cache = KvCache::new(1, 8, bs, nkv, hd);
        // A 10-token sequence stored in blocks 5, 1, 6 (out of order on purpose).
        let table = vec![5u32, 1, 6];
        let n = 10;
        let val =
            |t: usize, h: usize, d: usize, w: f32| ((t * 31 + h * 7 + d * 3) as f32 * w).sin();
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
        };
        let mut layer = std::mem::take(&mut cache.layers);
        write_kv(&mut layer[0], &cache, &batch, &k, &v);
        let nq = 4;
        let q: Vec<f32> = (0..n * nq * hd).map(|i| (i as f32 * 0.05).cos()).collect();
        let kv_of_q = [0, 0, 1, 1];
        let out = attend(
            &layer[0],
            &cache,
            &batch,
            &q,
            AttentionShape {
                num_q_heads: nq,
                head_dim: hd,
                kv_of_q: &kv_of_q,
                scale: 0.35,
            },
        );
        for t in 0..n {
            for h in 0..nq {
                let kvh = kv_of_q[h];
                let ks: Vec<Vec<f32>> = (0..=t)
                    .map(|p| k[(p * nkv + kvh) * hd..(p * nkv + kvh + 1) * hd].to_vec())
                    .collect();
                let vs: Vec<Vec<f32>> = (0..=t)
                    .map(|p| v[(p * nkv + kvh) * hd..(p * nkv + kvh + 1) * hd].to_vec())
                    .collect();
                let want = reference(&q[(t * nq + h) * hd..(t * nq + h + 1) * hd], &ks, &vs, 0.35);
                let got = &out[(t * nq + h) * hd..(t * nq + h + 1) * hd];
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "t={t} h={h}: {a} vs {b}");
                }
            }
        }
    }
}
