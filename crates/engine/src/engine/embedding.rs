//! An embedding sequence's pooled hidden states, gathered chunk by chunk (a long prompt
//! is prefilled in several steps) until its last chunk makes the embedding.

use tessera_protocol::{Pooling, PoolingKind};

use crate::model::decoder::Pooled;

/// What an embedding sequence has pooled so far.
#[derive(Debug)]
pub(super) struct PoolState {
    pooling: Pooling,
    sum: Vec<f32>,
    rows: usize,
    row: Option<Vec<f32>>,
}

impl PoolState {
    pub(super) fn new(pooling: Pooling) -> Self {
        Self {
            pooling,
            sum: Vec::new(),
            rows: 0,
            row: None,
        }
    }

    pub(super) fn kind(&self) -> PoolingKind {
        self.pooling.kind
    }

    /// Adds a chunk's part. A chunk at position 0 starts over: the sequence is being
    /// recomputed after a preemption.
    pub(super) fn add(&mut self, start_pos: usize, part: Pooled) {
        if start_pos == 0 {
            self.sum.clear();
            self.rows = 0;
            self.row = None;
        }
        match part {
            Pooled::Sum { sum, rows } => {
                if self.sum.is_empty() {
                    self.sum = vec![0.0; sum.len()];
                }
                for (s, v) in self.sum.iter_mut().zip(&sum) {
                    *s += v;
                }
                self.rows += rows;
            }
            Pooled::Row(row) => self.row = Some(row),
            Pooled::Nothing => {}
        }
    }

    /// The embedding, once the prompt's last chunk is in; `None` when a part it needs
    /// never came.
    pub(super) fn finish(&self) -> Option<Vec<f32>> {
        let mut v = match self.pooling.kind {
            PoolingKind::Mean if self.rows > 0 => {
                let n = self.rows as f32;
                self.sum.iter().map(|s| s / n).collect()
            }
            PoolingKind::Mean => return None,
            PoolingKind::Last | PoolingKind::Cls => self.row.clone()?,
        };
        if self.pooling.normalize {
            normalize(&mut v);
        }
        Some(v)
    }
}

/// Scales `v` to unit length (a zero vector stays as it is).
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in v.iter_mut() {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pooling(kind: PoolingKind, normalize: bool) -> Pooling {
        Pooling { kind, normalize }
    }

    #[test]
    fn mean_pooling_spans_chunks_and_a_recompute_starts_over() {
        let mut p = PoolState::new(pooling(PoolingKind::Mean, false));
        p.add(
            0,
            Pooled::Sum {
                sum: vec![1.0, 2.0],
                rows: 1,
            },
        );
        p.add(
            1,
            Pooled::Sum {
                sum: vec![5.0, 4.0],
                rows: 2,
            },
        );
        assert_eq!(p.finish(), Some(vec![2.0, 2.0]));
        p.add(
            0,
            Pooled::Sum {
                sum: vec![3.0, 0.0],
                rows: 1,
            },
        );
        assert_eq!(p.finish(), Some(vec![3.0, 0.0]));
    }

    #[test]
    fn cls_keeps_the_first_row_and_last_the_latest_normalized() {
        let mut cls = PoolState::new(pooling(PoolingKind::Cls, false));
        cls.add(0, Pooled::Row(vec![1.0, 0.0]));
        cls.add(4, Pooled::Nothing);
        assert_eq!(cls.finish(), Some(vec![1.0, 0.0]));
        let mut last = PoolState::new(pooling(PoolingKind::Last, true));
        last.add(0, Pooled::Row(vec![1.0, 1.0]));
        last.add(2, Pooled::Row(vec![3.0, 4.0]));
        assert_eq!(last.finish(), Some(vec![0.6, 0.8]));
        assert_eq!(
            PoolState::new(pooling(PoolingKind::Mean, true)).finish(),
            None
        );
    }
}
