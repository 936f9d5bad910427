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
//!
//! The k-quants (Q4_K, Q6_K) work on super-blocks of 256 values instead, kept in the
//! file's own value order (see [`crate::cpu::layout_k`]); their "pairs" below are
//! super-blocks.

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

/// The unit position of element `e` of block `k` of a pair: the inverse of
/// [`unit_source`].
#[inline(always)]
pub const fn unit_position(k: usize, e: usize) -> usize {
    ((e >> 2) << 3) | (k << 2) | (e & 3)
}

/// Values per super-block of the k-quants.
pub const QK_K: usize = 256;

/// GGML formats these kernels handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// 32 weights `d * q + m`, `q` in 0..16; activations are quantized to Q8_1.
    Q4_1,
    /// 32 weights `d * q`, `q` in -16..16 (four low bits and a fifth high bit);
    /// activations are quantized to Q8_0.
    Q5_0,
    /// 32 weights `d * q`, `q` in -127..=127; activations are quantized to Q8_0.
    Q8_0,
    /// 256 weights in 8 sub-blocks of 32: `d·sc_j·q − dmin·m_j`, `q` in 0..16, 6-bit
    /// `sc_j` and `m_j`; activations are quantized to Q8_K.
    Q4K,
    /// 256 weights in 16 sub-blocks of 16: `d·sc_j·(q − 32)`, `q` in 0..64, 8-bit signed
    /// `sc_j`; activations are quantized to Q8_K.
    Q6K,
}

impl WeightFormat {
    /// Values per block (per super-block for the k-quants).
    pub const fn block_values(self) -> usize {
        match self {
            Self::Q4_1 | Self::Q5_0 | Self::Q8_0 => QK,
            Self::Q4K | Self::Q6K => QK_K,
        }
    }

    /// Whether this is a k-quant (super-blocks of 256 values, Q8_K activations).
    pub const fn is_k(self) -> bool {
        matches!(self, Self::Q4K | Self::Q6K)
    }

    /// Bytes per block in a GGUF file.
    pub const fn file_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 4 + QK / 2,
            Self::Q5_0 => 2 + 4 + QK / 2,
            Self::Q8_0 => 2 + QK,
            Self::Q4K => 2 + 2 + 12 + QK_K / 2,
            Self::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        }
    }

    /// Bytes of quants per pair in memory: two nibbles per byte for Q4_1 and for Q5_0's
    /// low bits, one byte per value for Q8_0 (the k-quants keep their own layout).
    pub const fn pair_bytes(self) -> usize {
        match self {
            Self::Q4_1 | Self::Q5_0 => PAIR / 2,
            Self::Q8_0 => PAIR,
            Self::Q4K | Self::Q6K => 0,
        }
    }
}

/// Weight rows stored together: a kernel tile reads one contiguous stream.
pub const GROUP: usize = 4;

/// A `[rows, cols]` block-quantized weight matrix in unit order, rows in groups of
/// [`GROUP`] (the last group padded with zero rows).
///
/// For each group and pair of blocks, one chunk: the four rows' quants, then their
/// eight scales as f16 (row 0 block 0, row 0 block 1, row 1 block 0, …), then for Q4_1
/// their eight offsets `m` in the same order — the bytes of the GGUF file, reordered, so
/// a matmul streams no more memory than the file holds.
/// - Q4_1: byte `j` of a row's pair holds unit position `j` in its low nibble and
///   `j + 32` in its high nibble.
/// - Q5_0: the Q4_1 layout for the low four bits of `q + 16`, then, after the four rows'
///   quants, one 64-bit word per row whose bit `i` is the fifth bit of unit position `i`.
/// - Q8_0: sixteen rows per chunk instead, interleaved by four quants, see
///   [`crate::cpu::layout_q8`].
/// - Q4_K, Q6_K: one chunk per group and super-block, see [`crate::cpu::layout_k`].
#[derive(Debug, Clone)]
pub struct PackedWeights {
    pub(crate) format: WeightFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Pairs of blocks per row.
    pub(crate) pairs: usize,
    /// Chunks of quants, scales and offsets.
    pub(crate) chunks: Vec<u8>,
}

fn f16_at(bytes: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// One GGUF block: scale, offset, and its 32 quants (Q4_1: 0..16; Q5_0: signed).
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
        // Packed by their own modules.
        WeightFormat::Q8_0 | WeightFormat::Q4K | WeightFormat::Q6K => (f16::ZERO, f16::ZERO, q),
        WeightFormat::Q4_1 => {
            for j in 0..QK / 2 {
                q[j] = i32::from(b[4 + j] & 0x0F);
                q[j + QK / 2] = i32::from(b[4 + j] >> 4);
            }
            (f16_at(b, 0), f16_at(b, 2), q)
        }
    }
}

impl PackedWeights {
    /// Rows per chunk of a format.
    pub(crate) const fn group_rows(format: WeightFormat) -> usize {
        match format {
            WeightFormat::Q8_0 => crate::cpu::layout_q8::WIDE,
            _ => GROUP,
        }
    }

    /// Bytes of one (group, pair) chunk.
    pub(crate) const fn chunk_bytes(format: WeightFormat) -> usize {
        if matches!(format, WeightFormat::Q8_0) {
            return crate::cpu::layout_q8::CHUNK_BYTES;
        }
        let offsets = match format {
            WeightFormat::Q4_1 => GROUP * 2 * 2,
            _ => 0,
        };
        if format.is_k() {
            return GROUP * crate::cpu::layout_k::row_bytes(format);
        }
        Self::scales_at(format) + GROUP * 2 * 2 + offsets
    }

    /// Where a Q5_0 chunk's four 64-bit words of fifth bits start.
    pub(crate) const fn high_bits_at() -> usize {
        GROUP * WeightFormat::Q5_0.pair_bytes()
    }

    /// Where a chunk's eight f16 scales start.
    pub(crate) const fn scales_at(format: WeightFormat) -> usize {
        match format {
            WeightFormat::Q5_0 => Self::high_bits_at() + GROUP * 8,
            _ => GROUP * format.pair_bytes(),
        }
    }

    /// Where a Q4_1 chunk's eight f16 offsets start.
    pub(crate) const fn offsets_at(format: WeightFormat) -> usize {
        Self::scales_at(format) + GROUP * 2 * 2
    }

    /// Repacks a row-major GGUF tensor of `rows × cols` (cols a multiple of the
    /// format's block).
    pub fn from_ggml_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, String> {
        let block = format.block_values();
        if !cols.is_multiple_of(block) {
            return Err(format!(
                "{cols} columns are not a multiple of the {block}-value block of {format:?}"
            ));
        }
        let kb = cols / block;
        let fb = format.file_bytes();
        let expected = rows * kb * fb;
        if bytes.len() != expected {
            return Err(format!(
                "{rows}x{cols} {format:?} needs {expected} bytes, got {}",
                bytes.len()
            ));
        }
        if format.is_k() {
            return Ok(crate::cpu::layout_k::pack(format, rows, cols, bytes));
        }
        if format == WeightFormat::Q8_0 {
            return Ok(crate::cpu::layout_q8::pack(rows, cols, bytes));
        }
        let pairs = kb.div_ceil(2);
        let groups = rows.div_ceil(GROUP);
        let pb = format.pair_bytes();
        let cb = Self::chunk_bytes(format);
        let mut chunks = vec![0u8; groups * pairs * cb];
        crate::memory::advise_huge_pages(&mut chunks);
        for (row, src) in bytes.chunks_exact((kb * fb).max(1)).enumerate().take(rows) {
            let (g, r) = (row / GROUP, row % GROUP);
            for p in 0..pairs {
                let chunk = &mut chunks[(g * pairs + p) * cb..][..cb];
                let mut q = [[0i32; QK]; 2];
                for (k, qk) in q.iter_mut().enumerate() {
                    let b = 2 * p + k;
                    if b >= kb {
                        continue;
                    }
                    let (d, mb, vals) = parse_block(format, &src[b * fb..(b + 1) * fb]);
                    *qk = vals;
                    let at = Self::scales_at(format) + 2 * (2 * r + k);
                    chunk[at..at + 2].copy_from_slice(&d.to_le_bytes());
                    if format == WeightFormat::Q4_1 {
                        let at = Self::offsets_at(format) + 2 * (2 * r + k);
                        chunk[at..at + 2].copy_from_slice(&mb.to_le_bytes());
                    }
                }
                let unit = |i: usize| {
                    let (b, e) = unit_source(i);
                    q[b][e]
                };
                let quants = &mut chunk[r * pb..(r + 1) * pb];
                match format {
                    WeightFormat::Q4_1 => quants.iter_mut().enumerate().for_each(|(j, byte)| {
                        *byte = (unit(j) | (unit(j + PAIR / 2) << 4)) as u8;
                    }),
                    WeightFormat::Q5_0 => {
                        let u = |i: usize| (unit(i) + 16) as u8;
                        let mut high = 0u64;
                        for (j, byte) in quants.iter_mut().enumerate() {
                            *byte = (u(j) & 0x0F) | ((u(j + PAIR / 2) & 0x0F) << 4);
                        }
                        for i in 0..PAIR {
                            high |= u64::from(u(i) >> 4) << i;
                        }
                        let at = Self::high_bits_at() + 8 * r;
                        chunk[at..at + 8].copy_from_slice(&high.to_le_bytes());
                    }
                    WeightFormat::Q8_0 | WeightFormat::Q4K | WeightFormat::Q6K => {}
                }
            }
        }
        Ok(Self {
            format,
            rows,
            cols,
            pairs,
            chunks,
        })
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

    /// Rows including the padding of the last group.
    pub(crate) fn padded_rows(&self) -> usize {
        let g = Self::group_rows(self.format);
        self.rows.div_ceil(g) * g
    }

    /// Bytes held in memory.
    pub fn size_bytes(&self) -> usize {
        self.chunks.len()
    }

    /// The chunk of `row`'s group at pair `p`.
    pub(crate) fn chunk(&self, row: usize, p: usize) -> &[u8] {
        let cb = Self::chunk_bytes(self.format);
        let g = Self::group_rows(self.format);
        &self.chunks[((row / g) * self.pairs + p) * cb..][..cb]
    }

    /// Quant `i` (unit position) of pair `p` of `row`.
    pub(crate) fn quant(&self, row: usize, p: usize, i: usize) -> i32 {
        if self.format == WeightFormat::Q8_0 {
            return self.q8_quant(row, p, i);
        }
        let pb = self.format.pair_bytes();
        let quants = &self.chunk(row, p)[(row % GROUP) * pb..][..pb];
        let nibble = || {
            let byte = quants[i % (PAIR / 2)];
            i32::from(if i < PAIR / 2 { byte & 0x0F } else { byte >> 4 })
        };
        match self.format {
            WeightFormat::Q4_1 => nibble(),
            WeightFormat::Q5_0 => {
                let at = Self::high_bits_at() + 8 * (row % GROUP);
                let c = self.chunk(row, p);
                let high = u64::from_le_bytes(std::array::from_fn(|k| c[at + k]));
                nibble() + (((high >> i) & 1) as i32) * 16 - 16
            }
            WeightFormat::Q8_0 | WeightFormat::Q4K | WeightFormat::Q6K => 0,
        }
    }

    /// Scale of block `k` (0 or 1) of pair `p` of `row`.
    pub(crate) fn scale(&self, row: usize, p: usize, k: usize) -> f32 {
        if self.format == WeightFormat::Q8_0 {
            return self.q8_scale(row, p, k);
        }
        let at = Self::scales_at(self.format) + 2 * (2 * (row % GROUP) + k);
        f16_at(self.chunk(row, p), at).to_f32()
    }

    /// Offset of block `b` of `row` (0 for Q8_0).
    pub(crate) fn offset(&self, row: usize, b: usize) -> f32 {
        if self.format != WeightFormat::Q4_1 {
            return 0.0;
        }
        let at = Self::offsets_at(self.format) + 2 * (2 * (row % GROUP) + b % 2);
        f16_at(self.chunk(row, b / 2), at).to_f32()
    }

    /// The weights as f32, row-major (for tests and references).
    pub fn dequantize(&self) -> Vec<f32> {
        if self.format.is_k() {
            return crate::cpu::layout_k::dequantize(self);
        }
        let kb = self.cols / QK;
        let mut out = vec![0f32; self.rows * self.cols];
        for (row, o) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            for p in 0..self.pairs {
                for i in 0..PAIR {
                    let (k, e) = unit_source(i);
                    let b = 2 * p + k;
                    if b < kb {
                        o[b * QK + e] = self.scale(row, p, k) * self.quant(row, p, i) as f32
                            + self.offset(row, b);
                    }
                }
            }
        }
        out
    }
}
