//! The k-quants in memory: sixteen rows per chunk (one chunk per group and super-block of
//! 256 values), interleaved by four values as in [`crate::cpu::layout_wide`], so that a
//! byte product leaves one row per 32-bit lane. Quad `i` (0..64) is values `4i..4i+4` of
//! the super-block, in the file's value order (the order of Q8_K activations), for each
//! of the sixteen rows: value `v = 4r + e` of the quad is element `e` of row `r`.
//!
//! A chunk holds, rows innermost in every field:
//! - Q4_K: per quad 32 bytes of nibbles (byte `j`: value `j` in the low nibble, `j + 32`
//!   in the high one); the 6-bit sub-block scales `sc_j` (`8 × 16` bytes); the mins `m_j`
//!   in pairs (`4 × 16 × 2` bytes: pair `k`, row `r` holds `m_2k, m_2k+1`); `d` and `dmin`
//!   (`16 × f16` each). 148 bytes a row against the file's 144 (scales and mins unpacked).
//! - Q6_K: per quad 32 bytes of the low four bits as for Q4_K; per quad two 64-bit words,
//!   bit `v` of the first the fifth bit of value `v`, of the second the sixth; the signed
//!   sub-block scales (`16 × 16` bytes); `d` (`16 × f16`). The file's 210 bytes a row.
//!
//! Super-block layouts as ggml defines them (`block_q4_K`, `block_q6_K`):
//! - Q4_K: `d`, `dmin` (f16), 12 bytes of scales, 128 bytes of quants. For `j < 4`,
//!   `sc_j = s[j] & 63`, `m_j = s[j+4] & 63`; for `j ≥ 4`,
//!   `sc_j = (s[j+4] & 15) | (s[j-4] >> 6) << 4`, `m_j = (s[j+4] >> 4) | (s[j] >> 6) << 4`.
//!   Run `c` of 64 values: quant byte `32c + l` holds value `64c + l` (low nibble, sub-block
//!   `2c`) and `64c + 32 + l` (high nibble, sub-block `2c + 1`).
//! - Q6_K: 128 bytes `ql`, 64 bytes `qh`, 16 signed scales, `d` (f16). Half `n` (128
//!   values), `l < 32`: value `128n + 32k + l` takes its low four bits from
//!   `ql[64n + l + 32(k & 1)]` (low nibble for `k < 2`, high for `k ≥ 2`) and its two high
//!   bits from bits `2k, 2k+1` of `qh[32n + l]`; value `v` is in sub-block `v / 16`.

use half::f16;

use crate::cpu::layout::{PackedWeights, WeightFormat, QK_K};
use crate::cpu::layout_wide::{bit_at, nibble_at, QUAD, WIDE};

/// Quads per super-block.
pub(crate) const QUADS_K: usize = QK_K / 4;

/// Where each field of a chunk starts.
pub(crate) mod at {
    use super::{QUAD, QUADS_K, WIDE};

    /// Q4_K and Q6_K: the quants (Q6_K: their low four bits), 32 bytes per quad, from the
    /// chunk's start as in the 32-value formats ([`super::nibble_at`]).
    pub(crate) const QS: usize = 0;
    /// Q4_K: eight sub-block scales per row.
    pub(crate) const Q4K_SC: usize = QS + QUADS_K * QUAD / 2;
    /// Q4_K: eight sub-block mins per row, in pairs.
    pub(crate) const Q4K_MIN: usize = Q4K_SC + 8 * WIDE;
    /// Q4_K: `d` per row.
    pub(crate) const Q4K_D: usize = Q4K_MIN + 8 * WIDE;
    /// Q4_K: `dmin` per row.
    pub(crate) const Q4K_DMIN: usize = Q4K_D + 2 * WIDE;
    /// Q4_K: bytes of a chunk.
    pub(crate) const Q4K_END: usize = Q4K_DMIN + 2 * WIDE;
    /// Q6_K: the fifth and sixth bits, two 64-bit words per quad.
    pub(crate) const Q6K_QH: usize = QS + QUADS_K * QUAD / 2;
    /// Q6_K: sixteen signed sub-block scales per row.
    pub(crate) const Q6K_SC: usize = Q6K_QH + QUADS_K * 16;
    /// Q6_K: `d` per row.
    pub(crate) const Q6K_D: usize = Q6K_SC + 16 * WIDE;
    /// Q6_K: bytes of a chunk.
    pub(crate) const Q6K_END: usize = Q6K_D + 2 * WIDE;
}

/// Bytes of one (group, super-block) chunk.
pub(crate) const fn chunk_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q4K => at::Q4K_END,
        _ => at::Q6K_END,
    }
}

/// Q4_K's (and Q5_K's) 6-bit scale and min of sub-block `j` from the 12 packed bytes
/// (ggml's `get_scale_min_k4`).
pub(crate) fn scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The unsigned quant of value `v` of one file super-block (Q4_K: 0..16; Q6_K: 0..64).
fn file_quant(format: WeightFormat, b: &[u8], v: usize) -> u8 {
    match format {
        WeightFormat::Q4K => {
            let byte = b[16 + 32 * (v / 64) + v % 32];
            if (v / 32).is_multiple_of(2) {
                byte & 0x0F
            } else {
                byte >> 4
            }
        }
        _ => {
            let (n, k, l) = (v / 128, (v % 128) / 32, v % 32);
            let low = b[64 * n + l + 32 * (k & 1)];
            let low = if k < 2 { low & 0x0F } else { low >> 4 };
            low | (((b[128 + 32 * n + l] >> (2 * k)) & 3) << 4)
        }
    }
}

/// Repacks a row-major GGUF tensor whose shape the caller has checked.
pub(crate) fn pack(format: WeightFormat, rows: usize, cols: usize, bytes: &[u8]) -> PackedWeights {
    let sbs = cols / QK_K;
    let fb = format.file_bytes();
    let groups = rows.div_ceil(WIDE);
    let cb = chunk_bytes(format);
    let mut chunks = vec![0u8; groups * sbs * cb];
    crate::memory::advise_huge_pages(&mut chunks);
    for (row, src) in bytes.chunks_exact((sbs * fb).max(1)).enumerate().take(rows) {
        let (g, r) = (row / WIDE, row % WIDE);
        for sb in 0..sbs {
            let b = &src[sb * fb..(sb + 1) * fb];
            let chunk = &mut chunks[(g * sbs + sb) * cb..][..cb];
            for val in 0..QK_K {
                let (i, v) = (val / 4, 4 * r + val % 4);
                let q = file_quant(format, b, val);
                let (byte, high) = nibble_at(i, v);
                chunk[byte] |= if high { (q & 0x0F) << 4 } else { q & 0x0F };
                if format == WeightFormat::Q6K {
                    for bit in 0..2 {
                        if q & (0x10 << bit) != 0 {
                            let (byte, mask) = bit_at(at::Q6K_QH + 16 * i + 8 * bit, v);
                            chunk[byte] |= mask;
                        }
                    }
                }
            }
            match format {
                WeightFormat::Q4K => {
                    for j in 0..8 {
                        let (sc, m) = scale_min(&b[4..16], j);
                        chunk[at::Q4K_SC + WIDE * j + r] = sc;
                        chunk[at::Q4K_MIN + 2 * WIDE * (j / 2) + 2 * r + j % 2] = m;
                    }
                    chunk[at::Q4K_D + 2 * r..][..2].copy_from_slice(&b[0..2]);
                    chunk[at::Q4K_DMIN + 2 * r..][..2].copy_from_slice(&b[2..4]);
                }
                _ => {
                    for j in 0..16 {
                        chunk[at::Q6K_SC + WIDE * j + r] = b[192 + j];
                    }
                    chunk[at::Q6K_D + 2 * r..][..2].copy_from_slice(&b[208..210]);
                }
            }
        }
    }
    PackedWeights {
        format,
        rows,
        cols,
        pairs: sbs,
        chunks,
    }
}

fn f16_at(c: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([c[at], c[at + 1]]).to_f32()
}

impl PackedWeights {
    /// The stored quant of value `val` (0..256) of super-block `sb` of `row`, unsigned
    /// (Q4_K: 0..16; Q6_K: 0..64, the value being `q - 32`).
    pub(crate) fn k_quant(&self, row: usize, sb: usize, val: usize) -> i32 {
        let c = self.chunk(row, sb);
        let (i, v) = (val / 4, 4 * (row % WIDE) + val % 4);
        let (byte, high) = nibble_at(i, v);
        let mut q = if high { c[byte] >> 4 } else { c[byte] & 0x0F };
        if self.format == WeightFormat::Q6K {
            for bit in 0..2 {
                let (byte, mask) = bit_at(at::Q6K_QH + 16 * i + 8 * bit, v);
                if c[byte] & mask != 0 {
                    q |= 0x10 << bit;
                }
            }
        }
        i32::from(q)
    }

    /// Scale of sub-block `j` (Q4_K: 0..8, 6 bits; Q6_K: 0..16, signed).
    pub(crate) fn k_scale(&self, row: usize, sb: usize, j: usize) -> i32 {
        let c = self.chunk(row, sb);
        let r = row % WIDE;
        match self.format {
            WeightFormat::Q4K => i32::from(c[at::Q4K_SC + WIDE * j + r]),
            _ => i32::from(c[at::Q6K_SC + WIDE * j + r] as i8),
        }
    }

    /// Q4_K: min of sub-block `j` (0..8).
    pub(crate) fn k_min(&self, row: usize, sb: usize, j: usize) -> i32 {
        let at = at::Q4K_MIN + 2 * WIDE * (j / 2) + 2 * (row % WIDE) + j % 2;
        i32::from(self.chunk(row, sb)[at])
    }

    /// Super-block scale `d`.
    pub(crate) fn k_d(&self, row: usize, sb: usize) -> f32 {
        let at = match self.format {
            WeightFormat::Q4K => at::Q4K_D,
            _ => at::Q6K_D,
        };
        f16_at(self.chunk(row, sb), at + 2 * (row % WIDE))
    }

    /// Q4_K: super-block scale of the mins, `dmin`.
    pub(crate) fn k_dmin(&self, row: usize, sb: usize) -> f32 {
        f16_at(self.chunk(row, sb), at::Q4K_DMIN + 2 * (row % WIDE))
    }
}

/// The weights as f32, row-major, computed as ggml dequantizes them.
pub(crate) fn dequantize(w: &PackedWeights) -> Vec<f32> {
    let sbs = w.cols / QK_K;
    let mut out = vec![0f32; w.rows * w.cols];
    for (row, o) in out.chunks_exact_mut(w.cols.max(1)).enumerate() {
        for sb in 0..sbs {
            let d = w.k_d(row, sb);
            for v in 0..QK_K {
                let q = w.k_quant(row, sb, v);
                o[sb * QK_K + v] = match w.format {
                    WeightFormat::Q4K => {
                        let j = v / 32;
                        let scale = d * w.k_scale(row, sb, j) as f32;
                        let min = w.k_dmin(row, sb) * w.k_min(row, sb, j) as f32;
                        scale * q as f32 - min
                    }
                    _ => d * w.k_scale(row, sb, v / 16) as f32 * (q - 32) as f32,
                };
            }
        }
    }
    out
}
