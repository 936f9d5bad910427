//! Q4_1, Q5_0 and Q8_0 in memory: sixteen rows per chunk, interleaved so that one 512-bit
//! register holds four consecutive quants of each of the sixteen rows. A byte product that
//! sums groups of four bytes into 32-bit lanes then leaves one row per lane: a tile keeps
//! sixteen rows' sums in one register per activation row, with no horizontal reduction,
//! and each activation quad is a single broadcast shared by all sixteen rows.
//!
//! A *quad* `i` of a pair (0..16) is unit positions `4i..4i+4` of the pair (see
//! [`crate::cpu::layout`]; quad `i` belongs to block `i & 1`) for each of the sixteen rows:
//! 64 values, value `v = 4r + e` being element `e` of row `r`. A chunk (one group of
//! [`WIDE`] rows, one pair of blocks) holds:
//! - Q8_0: per quad 64 bytes, value `v` at byte `v` as `q + 128` (unsigned); then the
//!   scales.
//! - Q5_0: per quad 32 bytes of nibbles, byte `j` holding the low four bits of `q + 16`
//!   of value `j` (low nibble) and of value `j + 32` (high nibble); then per quad one
//!   64-bit word whose bit `v` is the fifth bit of value `v`; then the scales.
//! - Q4_1: per quad 32 bytes of nibbles of `q` as for Q5_0; then the scales, then the
//!   offsets `m`.
//!
//! Scales (and offsets) are f16, block 0 of rows 0..16, then block 1 of rows 0..16. A
//! chunk is the file's bytes for those 16 rows × 2 blocks, regrouped. Padding rows and
//! the padding block of an odd block count have quants 0 and scale 0: they add nothing.

use half::f16;

use crate::cpu::layout::{unit_source, PackedWeights, WeightFormat, PAIR, QK};

/// Rows per chunk: one 32-bit lane of a 512-bit register each.
pub(crate) const WIDE: usize = 16;
/// Quads per pair.
pub(crate) const QUADS: usize = PAIR / 4;
/// Values per quad (four quants of each of [`WIDE`] rows).
pub(crate) const QUAD: usize = 4 * WIDE;

/// Bytes of one quad's quants (Q4_1 and Q5_0: their low four bits).
pub(crate) const fn quad_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q8_0 => QUAD,
        _ => QUAD / 2,
    }
}

/// Where a Q5_0 chunk's fifth-bit words start.
pub(crate) const HIGH_AT: usize = QUADS * QUAD / 2;

/// Where a chunk's scales start.
pub(crate) const fn scales_at(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q5_0 => HIGH_AT + QUADS * 8,
        _ => QUADS * quad_bytes(format),
    }
}

/// Where a Q4_1 chunk's offsets start.
pub(crate) const OFFSETS_AT: usize = QUADS * QUAD / 2 + 2 * WIDE * 2;

/// Bytes of one (group, pair) chunk.
pub(crate) const fn chunk_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q4_1 => OFFSETS_AT + 2 * WIDE * 2,
        _ => scales_at(format) + 2 * WIDE * 2,
    }
}

/// The weight's bias in storage: quants are kept unsigned as `q + bias`.
pub(crate) const fn bias(format: WeightFormat) -> i32 {
    match format {
        WeightFormat::Q8_0 => 128,
        WeightFormat::Q5_0 => 16,
        _ => 0,
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// One GGUF block: scale, offset, and its 32 quants (Q4_1: 0..16; Q5_0, Q8_0: signed).
fn parse_block(format: WeightFormat, b: &[u8]) -> (f16, f16, [i32; QK]) {
    let mut q = [0i32; QK];
    match format {
        WeightFormat::Q5_0 => {
            let high = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let bit = |e: usize| ((high >> e) & 1) as i32;
            for j in 0..QK / 2 {
                q[j] = (i32::from(b[6 + j] & 0x0F) | (bit(j) << 4)) - 16;
                q[j + QK / 2] = (i32::from(b[6 + j] >> 4) | (bit(j + QK / 2) << 4)) - 16;
            }
            (f16_at(b, 0), f16::ZERO, q)
        }
        WeightFormat::Q4_1 => {
            for j in 0..QK / 2 {
                q[j] = i32::from(b[4 + j] & 0x0F);
                q[j + QK / 2] = i32::from(b[4 + j] >> 4);
            }
            (f16_at(b, 0), f16_at(b, 2), q)
        }
        WeightFormat::Q8_0 => {
            for (v, byte) in q.iter_mut().zip(&b[2..2 + QK]) {
                *v = i32::from(*byte as i8);
            }
            (f16_at(b, 0), f16::ZERO, q)
        }
        WeightFormat::Q4K | WeightFormat::Q6K => (f16::ZERO, f16::ZERO, q),
    }
}

/// Where the low four bits of value `v` of quad `i` are in a chunk whose nibbles start at
/// its byte 0 (32 bytes a quad, these formats' and the k-quants'): the byte, and whether
/// they are its high nibble.
pub(crate) const fn nibble_at(i: usize, v: usize) -> (usize, bool) {
    (i * QUAD / 2 + v % (QUAD / 2), v >= QUAD / 2)
}

/// Where bit `v` of the 64-bit word at byte `word` is: the byte and the bit's mask.
pub(crate) const fn bit_at(word: usize, v: usize) -> (usize, u8) {
    (word + v / 8, 1 << (v % 8))
}

/// Stores the biased quant `u` of value `v` of quad `i` into a chunk that holds zeros
/// there.
fn put_quant(format: WeightFormat, chunk: &mut [u8], i: usize, v: usize, u: u8) {
    if format == WeightFormat::Q8_0 {
        chunk[i * QUAD + v] = u;
        return;
    }
    let (byte, high) = nibble_at(i, v);
    chunk[byte] |= if high { (u & 0x0F) << 4 } else { u & 0x0F };
    if format == WeightFormat::Q5_0 && u & 0x10 != 0 {
        let (byte, mask) = bit_at(HIGH_AT + 8 * i, v);
        chunk[byte] |= mask;
    }
}

/// Repacks a row-major GGUF tensor whose shape the caller has checked. Every value of
/// every chunk is written once, padding rows and the padding block as quants of 0 (the
/// bias) with scale 0.
pub(crate) fn pack(format: WeightFormat, rows: usize, cols: usize, bytes: &[u8]) -> PackedWeights {
    let fb = format.file_bytes();
    let kb = cols / QK;
    let pairs = kb.div_ceil(2);
    let groups = rows.div_ceil(WIDE);
    let cb = chunk_bytes(format);
    let mut chunks = vec![0u8; groups * pairs * cb];
    crate::memory::advise_huge_pages(&mut chunks);
    for (c, chunk) in chunks.chunks_exact_mut(cb).enumerate() {
        let (g, p) = (c / pairs, c % pairs);
        for r in 0..WIDE {
            let row = g * WIDE + r;
            let mut q = [[0i32; QK]; 2];
            for (k, qk) in q.iter_mut().enumerate() {
                let b = 2 * p + k;
                if row >= rows || b >= kb {
                    continue;
                }
                let block = &bytes[(row * kb + b) * fb..][..fb];
                let (d, m, vals) = parse_block(format, block);
                *qk = vals;
                let at = scales_at(format) + 2 * (k * WIDE + r);
                chunk[at..at + 2].copy_from_slice(&d.to_le_bytes());
                if format == WeightFormat::Q4_1 {
                    let at = OFFSETS_AT + 2 * (k * WIDE + r);
                    chunk[at..at + 2].copy_from_slice(&m.to_le_bytes());
                }
            }
            for i in 0..PAIR {
                let (k, e) = unit_source(i);
                let u = (q[k][e] + bias(format)) as u8;
                put_quant(format, chunk, i / 4, 4 * r + i % 4, u);
            }
        }
    }
    PackedWeights {
        format,
        rows,
        cols,
        pairs,
        chunks,
    }
}

impl PackedWeights {
    /// Quant `i` (unit position) of pair `p` of `row`, unbiased.
    pub(crate) fn wide_quant(&self, row: usize, p: usize, i: usize) -> i32 {
        let c = self.chunk(row, p);
        let (quad, v) = (i / 4, 4 * (row % WIDE) + i % 4);
        let stored = match self.format {
            WeightFormat::Q8_0 => i32::from(c[quad * QUAD + v]),
            _ => {
                let (byte, high) = nibble_at(quad, v);
                let low = i32::from(if high { c[byte] >> 4 } else { c[byte] & 0x0F });
                let (byte, mask) = bit_at(HIGH_AT + 8 * quad, v);
                let fifth = self.format == WeightFormat::Q5_0 && c[byte] & mask != 0;
                low | (i32::from(fifth) << 4)
            }
        };
        stored - bias(self.format)
    }

    /// Scale of block `k` (0 or 1) of pair `p` of `row`.
    pub(crate) fn wide_scale(&self, row: usize, p: usize, k: usize) -> f32 {
        let at = scales_at(self.format) + 2 * (k * WIDE + row % WIDE);
        f16_at(self.chunk(row, p), at).to_f32()
    }

    /// Offset `m` of block `k` (0 or 1) of pair `p` of `row` (Q4_1; 0 otherwise).
    pub(crate) fn wide_offset(&self, row: usize, p: usize, k: usize) -> f32 {
        if self.format != WeightFormat::Q4_1 {
            return 0.0;
        }
        f16_at(self.chunk(row, p), OFFSETS_AT + 2 * (k * WIDE + row % WIDE)).to_f32()
    }
}
