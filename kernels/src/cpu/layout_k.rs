//! The k-quants in memory: super-blocks of 256 values in the file's own value order (no
//! reordering: a 64-value run of Q4_K quants is 32 bytes whose low nibbles are one
//! 32-value sub-block and high nibbles the next, which is what a SIMD product wants), four
//! rows per chunk so that a kernel tile streams one contiguous run.
//!
//! A chunk (one group of [`GROUP`] rows, one super-block) holds, row after row within
//! each field:
//! - Q4_K: quants `4 × 128` bytes (the file's), sub-block scales `4 × 8` bytes and mins
//!   `4 × 8` bytes (the file's 12 packed 6-bit bytes unpacked), `d` `4 × f16`, `dmin`
//!   `4 × f16` — 148 bytes a row against the file's 144.
//! - Q6_K: low bits `4 × 128`, high bits `4 × 64`, scales `4 × 16` (signed), `d`
//!   `4 × f16` — the file's 210 bytes a row, regrouped.
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

use crate::cpu::layout::{PackedWeights, WeightFormat, GROUP, QK_K};

/// Bytes of one row's super-block in memory.
pub(crate) const fn row_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q4K => QK_K / 2 + 8 + 8 + 2 + 2,
        WeightFormat::Q6K => QK_K / 2 + QK_K / 4 + 16 + 2,
        _ => 0,
    }
}

/// Where each field of a chunk starts.
pub(crate) mod at {
    use super::{GROUP, QK_K};

    /// Q4_K and Q6_K: the quants (Q6_K: their low four bits).
    pub(crate) const QS: usize = 0;
    /// Q4_K: eight sub-block scales per row.
    pub(crate) const Q4K_SC: usize = QS + GROUP * QK_K / 2;
    /// Q4_K: eight sub-block mins per row.
    pub(crate) const Q4K_MIN: usize = Q4K_SC + GROUP * 8;
    /// Q4_K: `d` per row.
    pub(crate) const Q4K_D: usize = Q4K_MIN + GROUP * 8;
    /// Q4_K: `dmin` per row.
    pub(crate) const Q4K_DMIN: usize = Q4K_D + GROUP * 2;
    /// Q6_K: the two high bits, 64 bytes per row.
    pub(crate) const Q6K_QH: usize = QS + GROUP * QK_K / 2;
    /// Q6_K: sixteen signed sub-block scales per row.
    pub(crate) const Q6K_SC: usize = Q6K_QH + GROUP * QK_K / 4;
    /// Q6_K: `d` per row.
    pub(crate) const Q6K_D: usize = Q6K_SC + GROUP * 16;
}

/// Q4_K's 6-bit scale and min of sub-block `j` from the 12 packed bytes.
fn scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Repacks a row-major GGUF tensor whose shape the caller has checked.
pub(crate) fn pack(format: WeightFormat, rows: usize, cols: usize, bytes: &[u8]) -> PackedWeights {
    let sbs = cols / QK_K;
    let fb = format.file_bytes();
    let groups = rows.div_ceil(GROUP);
    let cb = PackedWeights::chunk_bytes(format);
    let mut chunks = vec![0u8; groups * sbs * cb];
    crate::memory::advise_huge_pages(&mut chunks);
    for (row, src) in bytes.chunks_exact((sbs * fb).max(1)).enumerate().take(rows) {
        let (g, r) = (row / GROUP, row % GROUP);
        for sb in 0..sbs {
            let b = &src[sb * fb..(sb + 1) * fb];
            let chunk = &mut chunks[(g * sbs + sb) * cb..][..cb];
            let mut put = |at: usize, from: &[u8]| chunk[at..at + from.len()].copy_from_slice(from);
            match format {
                WeightFormat::Q4K => {
                    put(at::QS + r * 128, &b[16..144]);
                    let (sc, mn): (Vec<u8>, Vec<u8>) =
                        (0..8).map(|j| scale_min(&b[4..16], j)).unzip();
                    put(at::Q4K_SC + r * 8, &sc);
                    put(at::Q4K_MIN + r * 8, &mn);
                    put(at::Q4K_D + r * 2, &b[0..2]);
                    put(at::Q4K_DMIN + r * 2, &b[2..4]);
                }
                WeightFormat::Q6K => {
                    put(at::QS + r * 128, &b[0..128]);
                    put(at::Q6K_QH + r * 64, &b[128..192]);
                    put(at::Q6K_SC + r * 16, &b[192..208]);
                    put(at::Q6K_D + r * 2, &b[208..210]);
                }
                _ => {}
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
    /// The stored quant of value `v` (0..256) of super-block `sb` of `row`, unsigned
    /// (Q4_K: 0..16; Q6_K: 0..64, the value being `q - 32`).
    pub(crate) fn k_quant(&self, row: usize, sb: usize, v: usize) -> i32 {
        let c = self.chunk(row, sb);
        let r = row % GROUP;
        match self.format {
            WeightFormat::Q4K => {
                let byte = c[at::QS + r * 128 + 32 * (v / 64) + v % 32];
                i32::from(if (v / 32).is_multiple_of(2) {
                    byte & 0x0F
                } else {
                    byte >> 4
                })
            }
            WeightFormat::Q6K => {
                let (n, k, l) = (v / 128, (v % 128) / 32, v % 32);
                let low = c[at::QS + r * 128 + 64 * n + l + 32 * (k & 1)];
                let low = if k < 2 { low & 0x0F } else { low >> 4 };
                let high = (c[at::Q6K_QH + r * 64 + 32 * n + l] >> (2 * k)) & 3;
                i32::from(low | (high << 4))
            }
            _ => 0,
        }
    }

    /// Scale of sub-block `j` (Q4_K: 0..8, 6 bits; Q6_K: 0..16, signed).
    pub(crate) fn k_scale(&self, row: usize, sb: usize, j: usize) -> i32 {
        let c = self.chunk(row, sb);
        let r = row % GROUP;
        match self.format {
            WeightFormat::Q4K => i32::from(c[at::Q4K_SC + r * 8 + j]),
            WeightFormat::Q6K => i32::from(c[at::Q6K_SC + r * 16 + j] as i8),
            _ => 0,
        }
    }

    /// Q4_K: min of sub-block `j` (0..8).
    pub(crate) fn k_min(&self, row: usize, sb: usize, j: usize) -> i32 {
        i32::from(self.chunk(row, sb)[at::Q4K_MIN + (row % GROUP) * 8 + j])
    }

    /// Super-block scale `d`.
    pub(crate) fn k_d(&self, row: usize, sb: usize) -> f32 {
        let at = match self.format {
            WeightFormat::Q4K => at::Q4K_D,
            _ => at::Q6K_D,
        };
        f16_at(self.chunk(row, sb), at + 2 * (row % GROUP))
    }

    /// Q4_K: super-block scale of the mins, `dmin`.
    pub(crate) fn k_dmin(&self, row: usize, sb: usize) -> f32 {
        f16_at(self.chunk(row, sb), at::Q4K_DMIN + 2 * (row % GROUP))
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
