//! Rotary position embeddings, applied in place to rows of heads.

use crate::config::{RopeScaling, RopeStyle};

/// Precomputed `cos`/`sin` for every position up to the model's context.
#[derive(Debug, Clone)]
pub struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    style: RopeStyle,
    max_positions: usize,
}

impl RopeTable {
    pub fn new(head_dim: usize, theta: f32, max_positions: usize, style: RopeStyle) -> Self {
        Self::scaled(head_dim, theta, &RopeScaling::None, max_positions, style)
    }

    /// The table of a model whose frequencies `scaling` changes; its attention factor
    /// (YaRN) is folded into `cos` and `sin`, as transformers applies it.
    pub fn scaled(
        head_dim: usize,
        theta: f32,
        scaling: &RopeScaling,
        max_positions: usize,
        style: RopeStyle,
    ) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        // Angles in f64 and rounded once: both references agree with this to ~1e-7.
        let inv_freq = scaling.inv_freq(head_dim, theta);
        let gain = scaling.attention_factor();
        for pos in 0..max_positions {
            for f in &inv_freq {
                let angle = pos as f64 * f;
                cos.push((angle.cos() * gain) as f32);
                sin.push((angle.sin() * gain) as f32);
            }
        }
        Self {
            cos,
            sin,
            half,
            style,
            max_positions,
        }
    }

    /// A table of the same size that rotates nothing (cos 1, sin 0): what layers without
    /// position embedding use where the kernel always rotates.
    pub fn identity_like(&self) -> Self {
        let len = self.cos.len();
        Self {
            cos: vec![1.0; len],
            sin: vec![0.0; len],
            ..self.clone()
        }
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The `cos` and `sin` tables, `[max_positions, head_dim / 2]` row-major.
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    /// The `cos` and `sin` tables, `[max_positions, head_dim / 2]` f32, on `device`.
    pub fn tables_on(
        &self,
        device: &candle_core::Device,
    ) -> candle_core::Result<(candle_core::Tensor, candle_core::Tensor)> {
        let shape = (self.max_positions, self.half);
        Ok((
            candle_core::Tensor::from_slice(&self.cos, shape, device)?,
            candle_core::Tensor::from_slice(&self.sin, shape, device)?,
        ))
    }

    /// Whether rotation pairs are `(2i, 2i + 1)` rather than `(i, i + head_dim / 2)`.
    pub fn interleaved(&self) -> bool {
        self.style == RopeStyle::Interleaved
    }

    /// Rotates each `head_dim`-wide head in `heads` (several heads back to back) for `pos`.
    pub fn apply(&self, heads: &mut [f32], pos: usize) {
        let half = self.half;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
        for head in heads.chunks_exact_mut(2 * half) {
            match self.style {
                RopeStyle::Interleaved => {
                    for i in 0..half {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * cos[i] - b * sin[i];
                        head[2 * i + 1] = a * sin[i] + b * cos[i];
                    }
                }
                RopeStyle::Half => {
                    let (lo, hi) = head.split_at_mut(half);
                    for i in 0..half {
                        let (a, b) = (lo[i], hi[i]);
                        lo[i] = a * cos[i] - b * sin[i];
                        hi[i] = a * sin[i] + b * cos[i];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        for style in [RopeStyle::Interleaved, RopeStyle::Half] {
            let t = RopeTable::new(8, 10_000.0, 16, style);
            let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.7).collect();
            let mut x = orig.clone();
            t.apply(&mut x, 0);
            assert_eq!(x, orig);
            t.apply(&mut x, 5);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn styles_pair_different_dimensions() {
        let mut a = vec![1.0, 0.0, 0.0, 0.0];
        RopeTable::new(4, 1.0, 4, RopeStyle::Interleaved).apply(&mut a, 1);
        // Interleaved rotates (x0, x1): x1 becomes sin(1).
        assert!((a[1] - 1f32.sin()).abs() < 1e-6 && a[2] == 0.0);
        let mut b = vec![1.0, 0.0, 0.0, 0.0];
        RopeTable::new(4, 1.0, 4, RopeStyle::Half).apply(&mut b, 1);
        // Half rotates (x0, x2).
        assert!((b[2] - 1f32.sin()).abs() < 1e-6 && b[1] == 0.0);
    }
}
