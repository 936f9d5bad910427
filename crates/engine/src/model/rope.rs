//! Rotary position embeddings, applied in place to rows of heads.

use crate::spec::model::RopeStyle;
use crate::spec::rope::RopeScaling;

/// Precomputed `cos`/`sin` for every position up to the model's context: one entry per
/// rotation pair of a whole head (`head_dim / 2`), those past the rotated part of a head
/// (partial rotary) being 1 and 0, so that a kernel may treat every pair alike.
#[derive(Debug, Clone)]
pub struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    /// Rotation pairs of the rotated part of a head (`half` unless partial).
    rotary_half: usize,
    style: RopeStyle,
    max_positions: usize,
}

impl RopeTable {
    pub fn new(head_dim: usize, theta: f32, max_positions: usize, style: RopeStyle) -> Self {
        Self::scaled(
            (head_dim, head_dim),
            theta,
            &RopeScaling::None,
            max_positions,
            style,
        )
    }

    /// The table of a model whose heads of `dims.0` rotate their first `dims.1`
    /// dimensions, with frequencies that `scaling` changes for a context of
    /// `max_positions`; its attention factor (YaRN, LongRoPE) is folded into the rotated
    /// pairs' `cos` and `sin`, as transformers applies it.
    pub fn scaled(
        (head_dim, rotary_dim): (usize, usize),
        theta: f32,
        scaling: &RopeScaling,
        max_positions: usize,
        style: RopeStyle,
    ) -> Self {
        let half = head_dim / 2;
        let rotary_half = (rotary_dim / 2).min(half);
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        // Angles in f64 and rounded once: both references agree with this to ~1e-7.
        let inv_freq = scaling.inv_freq(rotary_dim, theta, max_positions);
        let gain = scaling.attention_factor();
        for pos in 0..max_positions {
            for f in inv_freq.iter().take(rotary_half) {
                let angle = pos as f64 * f;
                cos.push((angle.cos() * gain) as f32);
                sin.push((angle.sin() * gain) as f32);
            }
            cos.resize(cos.len() + half - rotary_half, 1.0);
            sin.resize(sin.len() + half - rotary_half, 0.0);
        }
        Self {
            cos,
            sin,
            half,
            rotary_half,
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

    /// Whether rotation pairs are `(2i, 2i + 1)` rather than `(i, i + rotary_dim / 2)`.
    pub fn interleaved(&self) -> bool {
        self.style == RopeStyle::Interleaved
    }

    /// Rotation pairs of the rotated part of a head: `head_dim / 2` unless only part of
    /// each head rotates.
    pub fn rotary_half(&self) -> usize {
        self.rotary_half
    }

    /// Rotates each `head_dim`-wide head in `heads` (several heads back to back) for `pos`:
    /// its first `2 · rotary_half` dimensions; the others pass through.
    pub fn apply(&self, heads: &mut [f32], pos: usize) {
        let (half, rot) = (self.half, self.rotary_half);
        let cos = &self.cos[pos * half..pos * half + rot];
        let sin = &self.sin[pos * half..pos * half + rot];
        for head in heads.chunks_exact_mut(2 * half) {
            match self.style {
                RopeStyle::Interleaved => {
                    for i in 0..rot {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * cos[i] - b * sin[i];
                        head[2 * i + 1] = a * sin[i] + b * cos[i];
                    }
                }
                RopeStyle::Half => {
                    let (lo, hi) = head[..2 * rot].split_at_mut(rot);
                    for i in 0..rot {
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

    #[test]
    fn partial_rotary_pairs_within_the_rotated_part_and_passes_the_rest() {
        // A head of 8 rotating its first 4: pairs (0, 2) and (1, 3); 4..8 untouched.
        let t = RopeTable::scaled((8, 4), 1.0, &RopeScaling::None, 4, RopeStyle::Half);
        let mut x = vec![1.0, 0.0, 0.0, 0.0, 5.0, 6.0, 7.0, 8.0];
        t.apply(&mut x, 1);
        assert!((x[2] - 1f32.sin()).abs() < 1e-6 && (x[0] - 1f32.cos()).abs() < 1e-6);
        assert_eq!(&x[4..], &[5.0, 6.0, 7.0, 8.0]);
        // The tables a kernel reads: 1 and 0 past the rotated pairs, whatever the gain.
        let longrope = RopeScaling::LongRope(crate::spec::rope::LongRope {
            short_factor: vec![1.0, 1.0],
            long_factor: vec![1.0, 1.0],
            original_context: 2.0,
            attention_factor: 1.5,
        });
        let t = RopeTable::scaled((8, 4), 1.0, &longrope, 4, RopeStyle::Half);
        let (cos, sin) = t.tables();
        assert_eq!((cos.len(), t.rotary_half()), (16, 2));
        assert_eq!(
            (cos[0], cos[1], cos[2], cos[3], sin[3]),
            (1.5, 1.5, 1.0, 1.0, 0.0)
        );
    }
}
