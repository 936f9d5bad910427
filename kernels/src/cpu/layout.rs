//! The in-memory layout every kernel reads.
//!
//! Blocks of 32 values are handled in pairs. A pair's 64 values are stored in *unit
//! order*: four values of the first block, four of the second, four of the first, … so
//! that in a SIMD product that sums groups of four bytes into one 32-bit lane, even lanes
//! hold the first block and odd lanes the second. Both blocks' scales then broadcast as a
//! single 64-bit value. Weights and activations use the same order, so the dot product
//! of a pair is the plain sum of byte products.
//!
//! A row with an odd number of blocks is padded with one zero block (scale 0, offset 0,
//! quants 0), which adds exactly nothing.

use half::f16;

/// Values per block of every format here.
pub const QK: usize = 32;
/// Values per pair of blocks.
pub const PAIR: usize = 2 * QK;

/// Where unit position `i` (0..64) of a pair comes from: (block in the pair, element).
#[inline]
pub const fn unit_source(i: usize) -> (usize, usize) {
    ((i >> 2) & 1, ((i >> 3) << 2) | (i & 3))
}

/// GGML formats these kernels handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// 32 weights `d * q + m`, `q` in 0..16; activations are quantized to Q8_1.
    Q4_1,
    /// 32 weights `d * q`, `q` in -127..=127; activations are quantized to Q8_0.
    Q8_0,
}

impl WeightFormat {
    /// Bytes per block in a GGUF file.
    pub const fn file_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 4 + QK / 2,
            Self::Q8_0 => 2 + QK,
        }
    }

    /// Bytes of quants per pair in memory: two nibbles per byte for Q4_1, one byte per
    /// value for Q8_0.
    pub const fn pair_bytes(self) -> usize {
        match self {
            Self::Q4_1 => PAIR / 2,
            Self::Q8_0 => PAIR,
        }
    }
}

/// A `[rows, cols]` block-quantized weight matrix in unit order.
///
/// - Q4_1: byte `j` of a pair holds unit position `j` in its low nibble and `j + 32` in
///   its high nibble.
/// - Q8_0: byte `j` holds unit position `j` as `q + 128` (unsigned), the operand order
///   of unsigned-by-signed byte products.
#[derive(Debug, Clone)]
pub struct PackedWeights {
    pub(crate) format: WeightFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Pairs of blocks per row.
    pub(crate) pairs: usize,
    pub(crate) qs: Vec<u8>,
    /// Scales, `2 * pairs` per row.
    pub(crate) d: Vec<f32>,
    /// Q4_1 offsets, `2 * pairs` per row (empty for Q8_0).
    pub(crate) m: Vec<f32>,
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// One GGUF block: scale, offset, and its 32 quants (Q4_1: 0..16; Q8_0: signed).
fn parse_block(format: WeightFormat, b: &[u8]) -> (f32, f32, [i32; QK]) {
    let mut q = [0i32; QK];
    match format {
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
            (f16_at(b, 0), 0.0, q)
        }
    }
}

impl PackedWeights {
    /// Repacks a row-major GGUF tensor of `rows × cols` (cols a multiple of 32).
    pub fn from_ggml_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, String> {
        if !cols.is_multiple_of(QK) {
            return Err(format!(
                "{cols} columns are not a multiple of the {QK}-value block"
            ));
        }
        let kb = cols / QK;
        let expected = rows * kb * format.file_bytes();
        if bytes.len() != expected {
            return Err(format!(
                "{rows}x{cols} {format:?} needs {expected} bytes, got {}",
                bytes.len()
            ));
        }
        let pairs = kb.div_ceil(2);
        let mut w = Self {
            format,
            rows,
            cols,
            pairs,
            qs: Vec::with_capacity(rows * pairs * format.pair_bytes()),
            d: Vec::with_capacity(rows * 2 * pairs),
            m: Vec::with_capacity(if format == WeightFormat::Q4_1 {
                rows * 2 * pairs
            } else {
                0
            }),
        };
        let fb = format.file_bytes();
        for row in bytes.chunks_exact(kb * fb) {
            for p in 0..pairs {
                let mut q = [[0i32; QK]; 2];
                for (k, qk) in q.iter_mut().enumerate() {
                    let b = 2 * p + k;
                    let (d, m) = if b < kb {
                        let (d, m, vals) = parse_block(format, &row[b * fb..(b + 1) * fb]);
                        *qk = vals;
                        (d, m)
                    } else {
                        (0.0, 0.0)
                    };
                    w.d.push(d);
                    if format == WeightFormat::Q4_1 {
                        w.m.push(m);
                    }
                }
                let unit = |i: usize| {
                    let (b, e) = unit_source(i);
                    q[b][e]
                };
                match format {
                    WeightFormat::Q4_1 => w
                        .qs
                        .extend((0..PAIR / 2).map(|j| (unit(j) | (unit(j + PAIR / 2) << 4)) as u8)),
                    WeightFormat::Q8_0 => w.qs.extend((0..PAIR).map(|j| (unit(j) + 128) as u8)),
                }
            }
        }
        Ok(w)
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held in memory.
    pub fn size_bytes(&self) -> usize {
        self.qs.len() + 4 * (self.d.len() + self.m.len())
    }

    /// Quant `i` (unit position) of pair `p` of `row`.
    pub(crate) fn quant(&self, row: usize, p: usize, i: usize) -> i32 {
        let base = (row * self.pairs + p) * self.format.pair_bytes();
        match self.format {
            WeightFormat::Q4_1 => {
                let byte = self.qs[base + i % (PAIR / 2)];
                i32::from(if i < PAIR / 2 { byte & 0x0F } else { byte >> 4 })
            }
            WeightFormat::Q8_0 => i32::from(self.qs[base + i]) - 128,
        }
    }

    /// The weights as f32, row-major (for tests and references).
    pub fn dequantize(&self) -> Vec<f32> {
        let kb = self.cols / QK;
        let mut out = vec![0f32; self.rows * self.cols];
        for (row, o) in out.chunks_exact_mut(self.cols).enumerate() {
            for p in 0..self.pairs {
                for i in 0..PAIR {
                    let (k, e) = unit_source(i);
                    let b = 2 * p + k;
                    if b >= kb {
                        continue;
                    }
                    let at = row * 2 * self.pairs + b;
                    let m = self.m.get(at).copied().unwrap_or(0.0);
                    o[b * QK + e] = self.d[at] * self.quant(row, p, i) as f32 + m;
                }
            }
        }
        out
    }
}
