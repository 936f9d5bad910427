//! Q8_0 in memory: sixteen rows per chunk, interleaved so that one 512-bit register holds
//! four consecutive quants of each of the sixteen rows. A byte product that sums groups of
//! four bytes into 32-bit lanes then leaves one row per lane: a tile keeps sixteen rows'
//! sums in one register per activation row, with no horizontal reduction, and each
//! activation quad is a single broadcast shared by all sixteen rows.
//!
//! A chunk (one group of [`WIDE`] rows, one pair of blocks) holds:
//! - 16 quads of 64 bytes: quad `i` holds unit positions `4i..4i+4` of the pair (see
//!   [`crate::cpu::layout`]; quad `i` belongs to block `i & 1`), row `r` at bytes
//!   `4r..4r+4`, each quant stored as `q + 128` (unsigned);
//! - the scales as f16, block 0 of rows 0..16 then block 1 of rows 0..16.
//!
//! 1088 bytes, the file's 34 bytes per block and row, regrouped.

use half::f16;

use crate::cpu::layout::{unit_source, PackedWeights, WeightFormat, PAIR, QK};

/// Rows per Q8_0 chunk: one 32-bit lane of a 512-bit register each.
pub(crate) const WIDE: usize = 16;
/// Bytes per quad (four quants of each of [`WIDE`] rows).
pub(crate) const QUAD: usize = 4 * WIDE;
/// Where a chunk's scales start.
pub(crate) const SCALES_AT: usize = (PAIR / 4) * QUAD;
/// Bytes of one (group, pair) chunk.
pub(crate) const CHUNK_BYTES: usize = SCALES_AT + 2 * WIDE * 2;

/// Repacks a row-major GGUF Q8_0 tensor whose shape the caller has checked.
pub(crate) fn pack(rows: usize, cols: usize, bytes: &[u8]) -> PackedWeights {
    let fb = WeightFormat::Q8_0.file_bytes();
    let kb = cols / QK;
    let pairs = kb.div_ceil(2);
    let groups = rows.div_ceil(WIDE);
    let mut chunks = vec![0u8; groups * pairs * CHUNK_BYTES];
    crate::memory::advise_huge_pages(&mut chunks);
    // Padding rows and the padding block keep quants of 0 (stored 128) and scale 0.
    for c in chunks.chunks_exact_mut(CHUNK_BYTES) {
        c[..SCALES_AT].fill(128);
    }
    for (row, src) in bytes.chunks_exact((kb * fb).max(1)).enumerate().take(rows) {
        let (g, r) = (row / WIDE, row % WIDE);
        for p in 0..pairs {
            let chunk = &mut chunks[(g * pairs + p) * CHUNK_BYTES..][..CHUNK_BYTES];
            for k in 0..2 {
                let b = 2 * p + k;
                if b >= kb {
                    continue;
                }
                let block = &src[b * fb..(b + 1) * fb];
                let at = SCALES_AT + 2 * (k * WIDE + r);
                chunk[at..at + 2].copy_from_slice(&block[..2]);
            }
            for i in 0..PAIR {
                let (k, e) = unit_source(i);
                let b = 2 * p + k;
                if b < kb {
                    let q = src[b * fb + 2 + e] as i8;
                    chunk[quant_at(r, i)] = (i32::from(q) + 128) as u8;
                }
            }
        }
    }
    PackedWeights {
        format: WeightFormat::Q8_0,
        rows,
        cols,
        pairs,
        chunks,
    }
}

/// Where unit position `i` of row `r` (within its group) lies in a chunk.
const fn quant_at(r: usize, i: usize) -> usize {
    (i / 4) * QUAD + 4 * r + i % 4
}

impl PackedWeights {
    /// Q8_0: quant `i` (unit position) of pair `p` of `row`.
    pub(crate) fn q8_quant(&self, row: usize, p: usize, i: usize) -> i32 {
        i32::from(self.chunk(row, p)[quant_at(row % WIDE, i)]) - 128
    }

    /// Q8_0: scale of block `k` (0 or 1) of pair `p` of `row`.
    pub(crate) fn q8_scale(&self, row: usize, p: usize, k: usize) -> f32 {
        let at = SCALES_AT + 2 * (k * WIDE + row % WIDE);
        let c = self.chunk(row, p);
        f16::from_le_bytes([c[at], c[at + 1]]).to_f32()
    }
}
