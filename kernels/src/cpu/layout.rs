//! The in-memory layout every kernel reads.
//!
//! Blocks of 32 values are handled in pairs. A pair's 64 values are stored in *unit
//! order*: four values of the first block, four of the second, four of the first, … so
//! that the four values a 32-bit lane of a byte product sums always come from one block
//! (even quads the first, odd quads the second). Weights and activations use the same
//! order, so the dot product of a pair is the plain sum of byte products.
//!
//! A row with an odd number of blocks is padded with one zero block (scale 0, offset 0,
//! quants 0), which adds exactly nothing.
//!
//! The k-quants (Q4_K, Q6_K) work on super-blocks of 256 values instead, kept in the
//! file's own value order (see [`crate::cpu::layout_k`]); their "pairs" below are
//! super-blocks.

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
}

/// A `[rows, cols]` block-quantized weight matrix, rows in groups of [`WIDE`] (the last
/// group padded with zero rows), stored as one chunk per group and pair of blocks (super-block for the
/// k-quants): the bytes of the GGUF file, regrouped, so a matmul streams no more memory
/// than the file holds.
/// - Q4_1, Q5_0, Q8_0: sixteen rows per chunk, interleaved by four quants, see
///   [`crate::cpu::layout_wide`].
/// - Q4_K, Q6_K: sixteen rows per chunk too, see [`crate::cpu::layout_k`].
#[derive(Debug, Clone)]
pub struct PackedWeights {
    pub(crate) format: WeightFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Pairs of blocks per row (super-blocks for the k-quants).
    pub(crate) pairs: usize,
    /// Chunks of quants, scales and offsets.
    pub(crate) chunks: Vec<u8>,
}
