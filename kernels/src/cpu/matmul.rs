//! `y = x Wᵀ` for block-quantized `W`: the activations are quantized once per call,
//! then every output feature is an independent dot product (parallel over rows of `W`
//! on the caller's rayon pool).

use rayon::prelude::*;

use crate::cpu::blocks::{BlockQ4_1, BlockQ8_0, QK};
use crate::cpu::dot::{isa, WeightBlock};

/// GGML formats these kernels handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    Q4_1,
    Q8_0,
}

#[derive(Debug, Clone)]
enum Blocks {
    Q4_1(Vec<BlockQ4_1>),
    Q8_0(Vec<BlockQ8_0>),
}

/// A `[rows, cols]` weight matrix in one of the supported block formats.
#[derive(Debug, Clone)]
pub struct QuantWeights {
    rows: usize,
    cols: usize,
    blocks: Blocks,
}

/// Output rows computed per parallel task.
const ROWS_PER_TASK: usize = 16;

impl QuantWeights {
    /// Parses a row-major GGUF tensor of `rows × cols` (cols a multiple of 32).
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
        let per_block = match format {
            WeightFormat::Q4_1 => BlockQ4_1::FILE_BYTES,
            WeightFormat::Q8_0 => BlockQ8_0::FILE_BYTES,
        };
        let expected = rows * cols / QK * per_block;
        if bytes.len() != expected {
            return Err(format!(
                "{rows}x{cols} {format:?} needs {expected} bytes, got {}",
                bytes.len()
            ));
        }
        let blocks = match format {
            WeightFormat::Q4_1 => Blocks::Q4_1(BlockQ4_1::parse(bytes)),
            WeightFormat::Q8_0 => Blocks::Q8_0(BlockQ8_0::parse(bytes)),
        };
        Ok(Self { rows, cols, blocks })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held in memory.
    pub fn size_bytes(&self) -> usize {
        match &self.blocks {
            Blocks::Q4_1(b) => std::mem::size_of_val(b.as_slice()),
            Blocks::Q8_0(b) => std::mem::size_of_val(b.as_slice()),
        }
    }

    /// The weights as f32, row-major (for tests and references).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        match &self.blocks {
            Blocks::Q4_1(b) => b
                .iter()
                .zip(out.chunks_exact_mut(QK))
                .for_each(|(b, o)| b.dequantize(o)),
            Blocks::Q8_0(b) => b
                .iter()
                .zip(out.chunks_exact_mut(QK))
                .for_each(|(b, o)| b.dequantize(o)),
        }
        out
    }

    /// `x`: `[m, cols]` row-major; returns `[m, rows]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.cols, "activation shape");
        let by_row = match &self.blocks {
            Blocks::Q4_1(w) => rows_times(w, x, m, self.rows, self.cols),
            Blocks::Q8_0(w) => rows_times(w, x, m, self.rows, self.cols),
        };
        if m == 1 {
            return by_row;
        }
        let mut out = vec![0f32; m * self.rows];
        for (r, vals) in by_row.chunks_exact(m).enumerate() {
            for (t, v) in vals.iter().enumerate() {
                out[t * self.rows + r] = *v;
            }
        }
        out
    }
}

/// Every weight row times every (quantized) activation row, feature-major: `[rows, m]`,
/// so each parallel task owns a contiguous slice. Rows go four at a time through
/// [`WeightBlock::dot4`], which gives the same values as one at a time.
fn rows_times<W: WeightBlock>(w: &[W], x: &[f32], m: usize, rows: usize, cols: usize) -> Vec<f32> {
    let kb = cols / QK;
    let isa = isa();
    let mut xq = vec![W::Act::default(); m * kb];
    for (row, xr) in xq.chunks_exact_mut(kb).zip(x.chunks_exact(cols)) {
        W::quantize_row(xr, row);
    }
    let mut by_row = vec![0f32; rows * m];
    by_row
        .par_chunks_mut(ROWS_PER_TASK * m)
        .enumerate()
        .for_each(|(task, out)| {
            let first = task * ROWS_PER_TASK;
            let n = out.len() / m;
            let row = |i: usize| &w[(first + i) * kb..(first + i + 1) * kb];
            let mut i = 0;
            while i + 4 <= n {
                for t in 0..m {
                    let y = &xq[t * kb..(t + 1) * kb];
                    let d = W::dot4(isa, [row(i), row(i + 1), row(i + 2), row(i + 3)], y);
                    for (j, v) in d.into_iter().enumerate() {
                        out[(i + j) * m + t] = v;
                    }
                }
                i += 4;
            }
            for i in i..n {
                for t in 0..m {
                    out[i * m + t] = W::dot(isa, row(i), &xq[t * kb..(t + 1) * kb]);
                }
            }
        });
    by_row
}
