//! Split states: how one tensor is laid out over the ranks of a tensor-parallel group.
//!
//! Every weight is `Split` (each rank holds a slice along an axis, per segment),
//! `Mirrored` (every rank holds all of it) or produces a `Partial` result (each rank holds
//! a partial sum that an all-reduce makes whole). A fused matrix such as QKV or gate_up has
//! several segments along the split axis; each segment is split on its own, so every rank
//! gets a slice of Q, of K and of V.

use std::ops::Range;

use crate::error::{EngineError, Result};

/// One segment of a split axis and the slice of it each rank holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Length of the segment along the split axis.
    pub len: usize,
    /// Per rank, the range within the segment (0-based in the segment).
    pub ranges: Vec<Range<usize>>,
}

/// How a tensor is distributed over the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitState {
    /// Each rank holds, for every segment, its range along `axis` (0 = rows/output
    /// features, 1 = columns/input features of a `[out, in]` weight).
    Split { axis: usize, segments: Vec<Segment> },
    /// Every rank holds the whole tensor.
    Mirrored,
    /// Each rank holds a partial sum of the whole tensor (an activation, not a weight).
    Partial,
}

impl SplitState {
    /// A single-segment split.
    pub fn split(axis: usize, len: usize, ranges: Vec<Range<usize>>) -> Self {
        SplitState::Split {
            axis,
            segments: vec![Segment { len, ranges }],
        }
    }

    /// The ranges, in the full tensor's coordinates along the split axis, that `rank`
    /// holds, in segment order. `None` for mirrored tensors.
    pub fn rank_ranges(&self, rank: usize) -> Option<Vec<Range<usize>>> {
        match self {
            SplitState::Split { segments, .. } => {
                let mut offset = 0;
                let mut out = Vec::with_capacity(segments.len());
                for seg in segments {
                    let r = seg.ranges.get(rank)?;
                    out.push(offset + r.start..offset + r.end);
                    offset += seg.len;
                }
                Some(out)
            }
            SplitState::Mirrored | SplitState::Partial => None,
        }
    }

    /// Length along the split axis that `rank` holds.
    pub fn rank_len(&self, rank: usize) -> Option<usize> {
        self.rank_ranges(rank)
            .map(|rs| rs.iter().map(|r| r.end - r.start).sum())
    }
}

/// Cuts `units` into one contiguous range per rank, proportional to `ratios`, with every
/// boundary on a multiple of `granule` units. The end of the units is a boundary too (a
/// quantized row ends on a whole block), so a remainder is one more piece, which the
/// last rank takes. Every rank gets at least one piece; otherwise the split is rejected.
pub fn split_units(
    units: usize,
    ratios: &[f64],
    granule: usize,
    what: &str,
) -> Result<Vec<Range<usize>>> {
    let world = ratios.len();
    if world == 0 {
        return Err(EngineError::Parallel("no ranks to split over".into()));
    }
    if ratios.iter().any(|r| !r.is_finite() || *r <= 0.0) {
        return Err(EngineError::Parallel(format!(
            "split ratios must be positive numbers, got {ratios:?}"
        )));
    }
    let granule = granule.max(1);
    let pieces = units.div_ceil(granule);
    if pieces < world {
        return Err(EngineError::Parallel(format!(
            "{what}: {units} units in granules of {granule} give {pieces} pieces, \
             too few for {world} ranks; use at most {} ranks",
            pieces.max(1)
        )));
    }
    let total: f64 = ratios.iter().sum();
    let mut bounds = Vec::with_capacity(world + 1);
    bounds.push(0usize);
    let mut cumulative = 0.0;
    for (rank, ratio) in ratios.iter().enumerate().take(world - 1) {
        cumulative += ratio;
        let ideal = (units as f64 * cumulative / total / granule as f64).round() as usize;
        let prev = bounds[rank];
        // Each rank keeps at least one piece, and leaves one for every later rank.
        let lo = prev + 1;
        let hi = pieces - (world - 1 - rank);
        bounds.push(ideal.clamp(lo, hi));
    }
    bounds.push(pieces);
    Ok(bounds
        .windows(2)
        .map(|w| w[0] * granule..(w[1] * granule).min(units))
        .collect())
}

/// Smallest number of units whose width in columns is a multiple of `block` columns.
pub fn granule_for(unit_cols: usize, block: usize) -> usize {
    let block = block.max(1);
    let g = gcd(unit_cols, block);
    block / g
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a.max(1)
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_and_uneven_splits() -> Result<()> {
        assert_eq!(split_units(3, &[1.0, 1.0], 1, "t")?, vec![0..2, 2..3]);
        assert_eq!(split_units(3, &[1.0; 3], 1, "t")?, vec![0..1, 1..2, 2..3]);
        assert_eq!(
            split_units(9, &[1.0; 4], 1, "t")?,
            vec![0..2, 2..5, 5..7, 7..9]
        );
        assert_eq!(
            split_units(1536, &[3.0, 1.0], 32, "t")?,
            vec![0..1152, 1152..1536]
        );
        Ok(())
    }

    #[test]
    fn remainder_goes_to_last_rank() -> Result<()> {
        assert_eq!(
            split_units(100, &[1.0, 1.0], 32, "t")?,
            vec![0..64, 64..100]
        );
        Ok(())
    }

    #[test]
    fn fewer_units_than_a_granule_stay_whole() -> Result<()> {
        // Two KV groups of 192 columns under 256-column blocks: one rank holds both; two
        // cannot split them on a block.
        assert_eq!(split_units(2, &[1.0], 4, "t")?, vec![0..2]);
        assert!(split_units(2, &[1.0, 1.0], 4, "t").is_err());
        // A partial last piece is the last rank's whole share.
        assert_eq!(split_units(6, &[1.0, 1.0], 4, "t")?, vec![0..4, 4..6]);
        Ok(())
    }

    #[test]
    fn too_many_ranks_is_rejected_with_the_fix() {
        let err = split_units(3, &[1.0; 4], 1, "KV groups");
        let msg = err
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
            .to_string();
        assert!(msg.contains("at most 3 ranks"), "{msg}");
    }

    #[test]
    fn bad_ratios_are_rejected() {
        assert!(split_units(8, &[1.0, 0.0], 1, "t").is_err());
        assert!(split_units(8, &[1.0, f64::NAN], 1, "t").is_err());
        assert!(split_units(8, &[], 1, "t").is_err());
    }

    #[test]
    fn granules_follow_quant_blocks() {
        assert_eq!(granule_for(64, 32), 1);
        assert_eq!(granule_for(64, 256), 4);
        assert_eq!(granule_for(192, 256), 4);
        assert_eq!(granule_for(1, 1), 1);
    }

    #[test]
    fn segments_map_to_full_coordinates() {
        let s = SplitState::Split {
            axis: 0,
            segments: vec![
                Segment {
                    len: 6,
                    ranges: vec![0..4, 4..6],
                },
                Segment {
                    len: 2,
                    ranges: vec![0..1, 1..2],
                },
            ],
        };
        assert_eq!(s.rank_ranges(0), Some(vec![0..4, 6..7]));
        assert_eq!(s.rank_ranges(1), Some(vec![4..6, 7..8]));
        assert_eq!(s.rank_len(1), Some(3));
        assert_eq!(SplitState::Mirrored.rank_ranges(0), None);
    }
}
