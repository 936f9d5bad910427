//! The methods of [`PackedWeights`] that choose between the layouts: repacking a GGUF
//! tensor, chunk sizes and addresses, and dequantizing for tests and references.

use crate::cpu::layout::{unit_source, PackedWeights, WeightFormat, PAIR, QK};
use crate::cpu::layout_wide::WIDE;

impl PackedWeights {
    /// Bytes of one (group, pair) chunk.
    pub(crate) const fn chunk_bytes(format: WeightFormat) -> usize {
        if format.is_k() {
            crate::cpu::layout_k::chunk_bytes(format)
        } else {
            crate::cpu::layout_wide::chunk_bytes(format)
        }
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
        let expected = rows * (cols / block) * format.file_bytes();
        if bytes.len() != expected {
            return Err(format!(
                "{rows}x{cols} {format:?} needs {expected} bytes, got {}",
                bytes.len()
            ));
        }
        Ok(if format.is_k() {
            crate::cpu::layout_k::pack(format, rows, cols, bytes)
        } else {
            crate::cpu::layout_wide::pack(format, rows, cols, bytes)
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
        self.rows.div_ceil(WIDE) * WIDE
    }

    /// Bytes held in memory.
    pub fn size_bytes(&self) -> usize {
        self.chunks.len()
    }

    /// The chunk of `row`'s group at pair `p`.
    pub(crate) fn chunk(&self, row: usize, p: usize) -> &[u8] {
        let cb = Self::chunk_bytes(self.format);
        &self.chunks[((row / WIDE) * self.pairs + p) * cb..][..cb]
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
                        o[b * QK + e] = self.wide_scale(row, p, k)
                            * self.wide_quant(row, p, i) as f32
                            + self.wide_offset(row, p, k);
                    }
                }
            }
        }
        out
    }
}
