//! Plain host references for the CUDA kernels, and the random inputs their checks use.
//!
//! The GPU checks (`crates/engine/tests/gpu`) compare the kernels on a device with these,
//! and `kernels/emulated` compares the same kernels run on CPU threads with them. They
//! are written for clarity: one loop per formula, f32 throughout.

use super::launch::Gate;

/// A small deterministic generator (the checks need no statistical quality).
#[derive(Debug, Clone)]
pub struct Lcg(pub u64);

impl Lcg {
    /// 31 random bits.
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        self.next_u32() as f32 / (1u64 << 30) as f32 - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.next_u32() as usize % n.max(1)
    }

    pub fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The largest error of any row of `head_dim` values, relative to that row's largest
/// reference value. Attention outputs are weighted means of value rows: where the
/// weights are spread thin their magnitudes shrink, and an absolute bound would say
/// nothing.
pub fn max_row_relative_diff(got: &[f32], want: &[f32], head_dim: usize) -> f32 {
    assert_eq!(got.len(), want.len());
    got.chunks(head_dim)
        .zip(want.chunks(head_dim))
        .map(|(g, w)| {
            let norm = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
            max_abs_diff(g, w) / norm
        })
        .fold(0.0, f32::max)
}

/// The factor attention checks scale scores by (over the model's `1/√head_dim`), so
/// that uniform random queries and keys give peaked attention: with flat scores every
/// output is near the mean of the value rows whatever the weights, and a wrong merge of
/// a split decode's partitions moves outputs by less than the 16-bit rounding bound.
pub const SHARP_SCORES: f32 = 12.0;

/// One sequence of a step: its new tokens from `start_pos`, and its block table.
#[derive(Debug, Clone)]
pub struct StepSeq {
    pub start_pos: usize,
    pub num_tokens: usize,
    pub block_table: Vec<u32>,
}

impl StepSeq {
    /// The cache slot of position `pos`.
    pub fn slot(&self, pos: usize, block_size: usize) -> usize {
        self.block_table[pos / block_size] as usize * block_size + pos % block_size
    }
}

/// Sequences `(start_pos, new tokens)` whose blocks are scattered over a cache (shuffled,
/// so tables are never in order); returns them and the cache's number of blocks.
pub fn scattered(
    seqs: &[(usize, usize)],
    block_size: usize,
    rng: &mut Lcg,
) -> (Vec<StepSeq>, usize) {
    let needed: usize = seqs.iter().map(|(p, n)| (p + n).div_ceil(block_size)).sum();
    let num_blocks = needed + 3;
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    rng.shuffle(&mut free);
    let out = seqs
        .iter()
        .map(|&(start_pos, num_tokens)| StepSeq {
            start_pos,
            num_tokens,
            block_table: free.split_off(free.len() - (start_pos + num_tokens).div_ceil(block_size)),
        })
        .collect();
    (out, num_blocks)
}

/// A step's attention problem: fused QKV rows (`[tokens, (nq + 2 nkv) hd]`, rotated
/// queries first) and K/V caches `[slots, nkv, hd]`.
#[derive(Debug, Clone, Copy)]
pub struct AttentionInput<'a> {
    pub qkv: &'a [f32],
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    pub seqs: &'a [StepSeq],
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Each token attends to its last `window` positions only.
    pub window: Option<usize>,
    pub scale: f32,
    /// Scaled scores become `cap · tanh(score / cap)` (Gemma 2).
    pub softcap: Option<f32>,
    /// One logit per query head that joins its softmax and attends to nothing (gpt-oss).
    pub sinks: Option<&'a [f32]>,
}

/// Causal attention of every token over its sequence's positions `0..=pos` (or its
/// window), softmax in f32: `[tokens, nq · hd]`.
pub fn attention(a: &AttentionInput<'_>) -> Vec<f32> {
    let (nq, nkv, hd) = (a.num_q_heads, a.num_kv_heads, a.head_dim);
    let width = (nq + 2 * nkv) * hd;
    let row = nkv * hd;
    let group = nq / nkv;
    let n: usize = a.seqs.iter().map(|s| s.num_tokens).sum();
    let mut out = vec![0f32; n * nq * hd];
    let mut t = 0;
    for s in a.seqs {
        for pos in s.start_pos..s.start_pos + s.num_tokens {
            for h in 0..nq {
                let kvh = h / group;
                let q = &a.qkv[t * width + h * hd..t * width + (h + 1) * hd];
                let at = |buf: &'_ [f32], j: usize| -> Vec<f32> {
                    let slot = s.slot(j, a.block_size);
                    buf[slot * row + kvh * hd..slot * row + (kvh + 1) * hd].to_vec()
                };
                let lo = a.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let scores: Vec<f32> = (lo..=pos)
                    .map(|j| {
                        q.iter()
                            .zip(at(a.k_cache, j))
                            .map(|(x, y)| x * y)
                            .sum::<f32>()
                            * a.scale
                    })
                    .map(|x| a.softcap.map_or(x, |cap| cap * (x / cap).tanh()))
                    .collect();
                let sink = a.sinks.map(|s| s[h]);
                let m = scores
                    .iter()
                    .chain(&sink)
                    .cloned()
                    .fold(f32::NEG_INFINITY, f32::max);
                let w: Vec<f32> = scores.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = w.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - m).exp());
                let o = &mut out[(t * nq + h) * hd..(t * nq + h + 1) * hd];
                for (j, wj) in (lo..=pos).zip(&w) {
                    for (od, vd) in o.iter_mut().zip(at(a.v_cache, j)) {
                        *od += wj / z * vd;
                    }
                }
            }
            t += 1;
        }
    }
    out
}

/// The activation of a gate value.
pub fn activate(gate: Gate, g: f32) -> f32 {
    match gate {
        Gate::Silu => g / (1.0 + (-g).exp()),
        Gate::GeluTanh => {
            let k = (2.0 / std::f32::consts::PI).sqrt();
            0.5 * g * (1.0 + (k * (g + 0.044715 * g * g * g)).tanh())
        }
    }
}

/// act(gate) · up of fused `[rows, 2 · width]` rows (gate first): `[rows, width]`.
pub fn gated(gate_up: &[f32], width: usize, gate: Gate) -> Vec<f32> {
    gate_up
        .chunks(2 * width)
        .flat_map(|r| (0..width).map(move |c| activate(gate, r[c]) * r[width + c]))
        .collect()
}

/// gpt-oss's experts' gate over fused `[rows, 2 · width]` rows (gate first): with
/// `g = min(gate, limit)`, `(clamp(up, ±limit) + 1) · g · σ(alpha · g)`.
pub fn clamped_gated(gate_up: &[f32], width: usize, alpha: f32, limit: f32) -> Vec<f32> {
    gate_up
        .chunks(2 * width)
        .flat_map(|r| {
            (0..width).map(move |c| {
                let g = r[c].min(limit);
                let u = r[width + c].clamp(-limit, limit);
                (u + 1.0) * g / (1.0 + (-alpha * g).exp())
            })
        })
        .collect()
}

/// `x + delta` (or `x`) and its RMSNorm times `w`, row by row (`w.len()` columns).
pub fn add_rms_norm(x: &[f32], delta: Option<&[f32]>, w: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let sum: Vec<f32> = match delta {
        Some(d) => x.iter().zip(d).map(|(a, b)| a + b).collect(),
        None => x.to_vec(),
    };
    let cols = w.len();
    let mut h = vec![0f32; sum.len()];
    for (row, out) in sum.chunks(cols).zip(h.chunks_mut(cols)) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / cols as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), g) in out.iter_mut().zip(row).zip(w) {
            *o = v * inv * g;
        }
    }
    (sum, h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checks' scores are sharp enough that merging two halves of a context without
    /// their softmax sums (the classic wrong merge of split partitions) moves outputs far
    /// past the bf16 bound, while flat scores hide it under an absolute bound.
    #[test]
    fn sharp_scores_expose_a_wrong_merge_of_partitions() {
        let (hd, n) = (64, 1500);
        let mut rng = Lcg(5);
        let q = rng.values(hd);
        let k = rng.values(n * hd);
        let v = rng.values(n * hd);
        let attend = |scale: f32, keys: std::ops::Range<usize>| -> (Vec<f32>, f32, f32) {
            let scores: Vec<f32> = keys
                .clone()
                .map(|j| {
                    q.iter()
                        .zip(&k[j * hd..(j + 1) * hd])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f32 = w.iter().sum();
            let mut o = vec![0f32; hd];
            for (j, wj) in keys.zip(&w) {
                for (od, vd) in o.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
                    *od += wj / z * vd;
                }
            }
            (o, m, z)
        };
        let wrong_merge = |scale: f32| {
            let (right, _, _) = attend(scale, 0..n);
            let (a, _, _) = attend(scale, 0..n / 2);
            let (b, _, _) = attend(scale, n / 2..n);
            let merged: Vec<f32> = a.iter().zip(&b).map(|(x, y)| (x + y) / 2.0).collect();
            max_row_relative_diff(&merged, &right, hd)
        };
        let base = 1.0 / (hd as f32).sqrt();
        // Four times the bf16 checks' bound of 2e-2 (measured: 0.114).
        let sharp = wrong_merge(base * SHARP_SCORES);
        assert!(sharp > 0.08, "{sharp}");
        // With the model's own scale on uniform values the same bug hides in the noise
        // of an absolute bound.
        let (right, _, _) = attend(base, 0..n);
        let (a, _, _) = attend(base, 0..n / 2);
        let (b, _, _) = attend(base, n / 2..n);
        let merged: Vec<f32> = a.iter().zip(&b).map(|(x, y)| (x + y) / 2.0).collect();
        assert!(max_abs_diff(&merged, &right) < 1e-2);
    }
}
