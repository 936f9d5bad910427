//! Writing a step's new keys and values into a CPU rank's paged cache, in the cache's
//! element type (`tessera_kernels::kv_quant` defines each and its scales).
//!
//! - Unscaled types store each value rounded.
//! - fp8: a layer whose per-head scales are still 0 takes them from this write (the
//!   warm-up step at load, [`crate::engine`]'s calibration): [`fp8_scale`] of each head's
//!   largest magnitude, for K and for V. Later writes divide by the fixed scales.
//! - int8: the step's tokens that land in one block form a run; per KV head the block's
//!   scale grows to hold the run ([`Int8Run`]), the block's earlier entries are
//!   requantized when it grew, then the run is stored. Positions of a block are written in
//!   order and a block's first write starts at its position 0 (a prefix hit, a fork and a
//!   recompute all start at a block boundary), so a run from position 0 starts the block
//!   anew, whatever it held for an earlier sequence.

use tessera_kernels::kv_quant::{
    fp8_scale, int8_quantize, int8_requantize, Int8Run, KvElement, ScaleKind,
};

use crate::model::batch::Batch;
use crate::model::kv_cache::{with_layer, KvCache, LayerCache, TypedLayer};

/// Writes the new tokens' keys and values (rows of `num_kv_heads * head_dim`) to their
/// slots.
pub fn write_kv(layer: &mut LayerCache, cache: &KvCache, batch: &Batch, k: &[f32], v: &[f32]) {
    with_layer!(layer, l => write_typed(l, cache, batch, k, v))
}

fn write_typed<T: KvElement>(
    l: &mut TypedLayer<T>,
    cache: &KvCache,
    batch: &Batch,
    k: &[f32],
    v: &[f32],
) {
    match T::DTYPE.scales() {
        ScaleKind::None => write_rows(l, cache, batch, k, v),
        ScaleKind::PerHead => {
            calibrate(&mut l.k_scales, k, cache.head_dim);
            calibrate(&mut l.v_scales, v, cache.head_dim);
            write_rows(l, cache, batch, k, v);
        }
        ScaleKind::PerBlockHead => write_runs(l, cache, batch, k, v),
    }
}

/// Sets each head's fp8 scale that is still 0 from the rows `x` (`[tokens, heads,
/// head_dim]`).
fn calibrate(scales: &mut [f32], x: &[f32], hd: usize) {
    if scales.iter().all(|s| *s > 0.0) {
        return;
    }
    let nkv = scales.len();
    let mut amax = vec![0f32; nkv];
    for (i, head) in x.chunks_exact(hd).enumerate() {
        let m = &mut amax[i % nkv];
        *m = head.iter().fold(*m, |m, x| m.max(x.abs()));
    }
    for (s, a) in scales.iter_mut().zip(amax) {
        if *s <= 0.0 {
            *s = fp8_scale(a);
        }
    }
}

/// Each value divided by its (block, head)'s scale, stored as `T`.
fn write_rows<T: KvElement>(
    l: &mut TypedLayer<T>,
    cache: &KvCache,
    batch: &Batch,
    k: &[f32],
    v: &[f32],
) {
    let (stride, nkv) = (cache.slot_stride(), cache.num_kv_heads);
    let (bs, hd) = (cache.block_size, cache.head_dim);
    for (t, &slot) in batch.slots.iter().enumerate() {
        let (block, i) = (slot / bs, slot % bs);
        let rows = k[t * stride..(t + 1) * stride].chunks_exact(hd);
        for (h, kh) in rows.enumerate() {
            let (base, scale) = (cache.key_row(block, h), l.k_scale(block, h, nkv));
            for (d, x) in kh.iter().enumerate() {
                l.k[base + d * bs + i] = T::encode(x / scale);
            }
        }
        let rows = v[t * stride..(t + 1) * stride].chunks_exact(hd);
        for (h, vh) in rows.enumerate() {
            let scale = l.v_scale(block, h, nkv);
            let out = &mut l.v[slot * stride + h * hd..slot * stride + (h + 1) * hd];
            for (o, x) in out.iter_mut().zip(vh) {
                *o = T::encode(x / scale);
            }
        }
    }
}

/// The int8 write: per run of tokens in one block and per KV head, the block's scales
/// updated and its entries requantized where they grew, then the run stored.
fn write_runs<T: KvElement>(
    l: &mut TypedLayer<T>,
    cache: &KvCache,
    batch: &Batch,
    k: &[f32],
    v: &[f32],
) {
    let (stride, nkv) = (cache.slot_stride(), cache.num_kv_heads);
    let (bs, hd) = (cache.block_size, cache.head_dim);
    let mut t0 = 0;
    while t0 < batch.slots.len() {
        let block = batch.slots[t0] / bs;
        let start = batch.slots[t0] % bs;
        // Tokens of one sequence in one block are consecutive in the batch and in the
        // block; a block never takes two sequences' writes.
        let len = batch.slots[t0..]
            .iter()
            .enumerate()
            .take_while(|(j, s)| start + j < bs && **s == block * bs + start + j)
            .count();
        let run = t0..t0 + len;
        for h in 0..nkv {
            let head = |x: &[f32], t: usize| {
                let o = t * stride + h * hd;
                x[o..o + hd].iter().fold(0f32, |m, x| m.max(x.abs()))
            };
            let idx = block * nkv + h;
            // Keys: [block, head, d, i].
            let k_run = Int8Run {
                old_scale: l.k_scales[idx],
                start,
                amax: run.clone().map(|t| head(k, t)).fold(0.0, f32::max),
            };
            let (old, new) = (l.k_scales[idx], k_run.scale());
            let base = cache.key_row(block, h);
            for d in 0..hd {
                let row = &mut l.k[base + d * bs..base + (d + 1) * bs];
                if k_run.rescales() {
                    for q in &mut row[..start] {
                        *q = T::encode(f32::from(int8_requantize(int8_of(*q), old, new)));
                    }
                }
                for (j, t) in run.clone().enumerate() {
                    let x = k[t * stride + h * hd + d];
                    row[start + j] = T::encode(f32::from(int8_quantize(x, new)));
                }
            }
            l.k_scales[idx] = new;
            // Values: [slot, head, d].
            let v_run = Int8Run {
                old_scale: l.v_scales[idx],
                start,
                amax: run.clone().map(|t| head(v, t)).fold(0.0, f32::max),
            };
            let (old, new) = (l.v_scales[idx], v_run.scale());
            let at = |i: usize| (block * bs + i) * stride + h * hd;
            if v_run.rescales() {
                for i in 0..start {
                    for q in &mut l.v[at(i)..at(i) + hd] {
                        *q = T::encode(f32::from(int8_requantize(int8_of(*q), old, new)));
                    }
                }
            }
            for (j, t) in run.clone().enumerate() {
                let src = &v[t * stride + h * hd..t * stride + (h + 1) * hd];
                for (q, x) in l.v[at(start + j)..at(start + j) + hd].iter_mut().zip(src) {
                    *q = T::encode(f32::from(int8_quantize(*x, new)));
                }
            }
            l.v_scales[idx] = new;
        }
        t0 += len.max(1);
    }
}

/// An int8 cache's stored value as `i8` (its decoding is exact).
fn int8_of<T: KvElement>(q: T) -> i8 {
    q.decode() as i8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::batch::BatchSeq;
    use crate::model::kv_cache::KvCacheDtype;

    /// A batch of one sequence's positions `start..start + n` in `table`'s blocks.
    fn batch(table: &[u32], start: usize, n: usize, bs: usize) -> Batch {
        Batch {
            token_ids: vec![0; n],
            positions: (start..start + n).collect(),
            slots: (start..start + n)
                .map(|p| table[p / bs] as usize * bs + p % bs)
                .collect(),
            seqs: vec![BatchSeq {
                token_start: 0,
                num_tokens: n,
                start_pos: start,
                block_table: table.to_vec(),
            }],
            sample_rows: vec![],
            row_reduce: vec![],
            pool: vec![],
            groups: vec![],
        }
    }

    /// Every stored value read back, as `[position, head, d]` over the table's positions.
    fn read_back(cache: &KvCache, table: &[u32], n: usize) -> (Vec<f32>, Vec<f32>) {
        let (bs, hd, nkv) = (cache.block_size, cache.head_dim, cache.num_kv_heads);
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        with_layer!(&cache.layers[0], l => {
            for p in 0..n {
                let (block, i) = (table[p / bs] as usize, p % bs);
                for h in 0..nkv {
                    for d in 0..hd {
                        let kq = l.k[cache.key_row(block, h) + d * bs + i];
                        ks.push(kq.decode() * l.k_scale(block, h, nkv));
                        let vq = l.v[(block * bs + i) * nkv * hd + h * hd + d];
                        vs.push(vq.decode() * l.v_scale(block, h, nkv));
                    }
                }
            }
        });
        (ks, vs)
    }

    #[test]
    fn each_type_reads_back_what_was_written_within_its_precision() {
        let (bs, nkv, hd, n) = (4, 2, 8, 11);
        // Blocks 0 and 1 follow each other: a run never crosses from one to the next.
        let table = [3u32, 0, 1];
        let val = |i: usize, w: f32| ((i as f32) * w).sin() * (1.0 + (i % 7) as f32);
        let k: Vec<f32> = (0..n * nkv * hd).map(|i| val(i, 0.37)).collect();
        let v: Vec<f32> = (0..n * nkv * hd).map(|i| val(i, 0.11)).collect();
        // Relative to each value's head and block, the error each type allows.
        for (dtype, bound) in [
            (KvCacheDtype::F32, 0.0),
            (KvCacheDtype::Bf16, 1.0 / 256.0),
            (KvCacheDtype::F16, 1.0 / 2048.0),
            (KvCacheDtype::Fp8E4m3, 1.0 / 16.0),
            (KvCacheDtype::Int8, 0.5 / 127.0),
        ] {
            let mut cache = KvCache::new(dtype, 1, 4, bs, nkv, hd).expect("cache");
            let mut layers = std::mem::take(&mut cache.layers);
            // Two steps: a prefill of 6 tokens, then 5 decodes, the way a sequence grows.
            for (start, len) in [(0, 6), (6, 1), (7, 1), (8, 1), (9, 1), (10, 1)] {
                let rows = start * nkv * hd..(start + len) * nkv * hd;
                let b = batch(&table, start, len, bs);
                write_kv(&mut layers[0], &cache, &b, &k[rows.clone()], &v[rows]);
            }
            cache.layers = layers;
            let fp8 = cache.layers[0]
                .fp8_scales()
                .map(|(k, v)| (k.to_vec(), v.to_vec()));
            let (ks, vs) = read_back(&cache, &table, n);
            for (which, got, want) in [(0, &ks, &k), (1, &vs, &v)] {
                for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    let (p, h) = (i / (nkv * hd), i / hd % nkv);
                    let tolerance = match (dtype, &fp8) {
                        // A half-step of the block's scale, which each requantization
                        // (as the block's scale grew) may add again.
                        (KvCacheDtype::Int8, _) => {
                            let block_max = (p / bs * bs..(p / bs * bs + bs).min(n))
                                .flat_map(|q| {
                                    want[(q * nkv + h) * hd..(q * nkv + h + 1) * hd].iter()
                                })
                                .fold(0f32, |m, x| m.max(x.abs()));
                            3.0 * bound * block_max
                        }
                        // Relative in the normal range, half a subnormal step below it.
                        (KvCacheDtype::Fp8E4m3, Some((sk, sv))) => {
                            let scale = if which == 0 { sk[h] } else { sv[h] };
                            bound * w.abs() + scale * 2f32.powi(-10)
                        }
                        _ => bound * w.abs(),
                    };
                    assert!(
                        (g - w).abs() <= tolerance + 1e-6,
                        "{dtype}: value {i}: {g} for {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_fp8_layer_keeps_the_scales_of_its_first_write() {
        let (bs, nkv, hd) = (4, 2, 8);
        let mut cache = KvCache::new(KvCacheDtype::Fp8E4m3, 1, 2, bs, nkv, hd).expect("cache");
        let mut layers = std::mem::take(&mut cache.layers);
        assert!(layers[0].fp8_scales().is_none());
        let k = vec![2.0f32; nkv * hd];
        write_kv(&mut layers[0], &cache, &batch(&[0, 1], 0, 1, bs), &k, &k);
        let (ks, _) = layers[0]
            .fp8_scales()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .unwrap_or_default();
        assert_eq!(ks, vec![fp8_scale(2.0); nkv]);
        // A later, larger value does not move them: it saturates at 448 · scale.
        let big = vec![1000.0f32; nkv * hd];
        write_kv(
            &mut layers[0],
            &cache,
            &batch(&[0, 1], 1, 1, bs),
            &big,
            &big,
        );
        assert_eq!(
            layers[0].fp8_scales().map(|(k, _)| k.to_vec()),
            Some(ks.clone())
        );
        cache.layers = layers;
        let (read, _) = read_back(&cache, &[0, 1], 2);
        assert_eq!(read[nkv * hd], 448.0 * ks[0]);
    }

    #[test]
    fn an_int8_block_rescales_its_earlier_entries_and_a_fresh_one_starts_anew() {
        let (bs, nkv, hd) = (4, 1, 8);
        let mut cache = KvCache::new(KvCacheDtype::Int8, 1, 2, bs, nkv, hd).expect("cache");
        let mut layers = std::mem::take(&mut cache.layers);
        let small = vec![1.0f32; hd];
        let large = vec![10.0f32; hd];
        write_kv(
            &mut layers[0],
            &cache,
            &batch(&[1], 0, 1, bs),
            &small,
            &small,
        );
        write_kv(
            &mut layers[0],
            &cache,
            &batch(&[1], 1, 1, bs),
            &large,
            &large,
        );
        let scale = |l: &LayerCache| match l {
            LayerCache::Int8(l) => (l.k_scales[1], l.v_scales[1]),
            _ => (0.0, 0.0),
        };
        assert_eq!(scale(&layers[0]), (10.0 / 127.0, 10.0 / 127.0));
        cache.layers = layers;
        let (ks, vs) = read_back(&cache, &[1], 2);
        // The first entry, requantized: 1.0 is 12.7 steps of 10/127, stored as 13.
        assert!((ks[0] - 13.0 * 10.0 / 127.0).abs() < 1e-6, "{}", ks[0]);
        assert_eq!(ks[0], vs[0]);
        assert!((ks[hd] - 10.0).abs() < 1e-5);
        // The block taken again by another sequence from its position 0: a small scale.
        let mut layers = std::mem::take(&mut cache.layers);
        write_kv(
            &mut layers[0],
            &cache,
            &batch(&[1], 0, 1, bs),
            &small,
            &small,
        );
        assert_eq!(scale(&layers[0]), (1.0 / 127.0, 1.0 / 127.0));
    }
}
