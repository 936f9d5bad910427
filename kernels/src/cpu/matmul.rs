//! `y = x Wᵀ` for block-quantized `W`: the activations are quantized once per call, then
//! output rows are split into parallel tasks on the caller's rayon pool. Inside a task,
//! tiles of four weight rows × four activation rows share their loads; every (row,
//! activation) pair is accumulated in the same order whatever tile it falls in, so the
//! result of a row does not depend on the batch around it.

use rayon::prelude::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::isa::Isa;
use crate::cpu::layout::{PackedWeights, WeightFormat};
use crate::cpu::scalar;

/// Output rows per parallel task.
const ROWS_PER_TASK: usize = 16;
/// Tile sides: weight rows and activation rows handled together.
const TILE_ROWS: usize = 4;
const TILE_TOKENS: usize = 4;

/// A `[rows, cols]` weight matrix in one of the supported block formats.
#[derive(Debug, Clone)]
pub struct QuantWeights {
    packed: PackedWeights,
}

impl QuantWeights {
    /// Parses a row-major GGUF tensor of `rows × cols` (cols a multiple of 32).
    pub fn from_ggml_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, String> {
        Ok(Self {
            packed: PackedWeights::from_ggml_bytes(format, rows, cols, bytes)?,
        })
    }

    pub fn format(&self) -> WeightFormat {
        self.packed.format()
    }

    pub fn rows(&self) -> usize {
        self.packed.rows()
    }

    pub fn cols(&self) -> usize {
        self.packed.cols()
    }

    /// Bytes held in memory.
    pub fn size_bytes(&self) -> usize {
        self.packed.size_bytes()
    }

    /// The weights as f32, row-major (for tests and references).
    pub fn dequantize(&self) -> Vec<f32> {
        self.packed.dequantize()
    }

    /// `x`: `[m, cols]` row-major; returns `[m, rows]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(Isa::detect(), x, m)
    }

    /// [`QuantWeights::matmul`] with a given implementation (which this CPU must
    /// support; an unsupported one falls back to the scalar code).
    pub fn matmul_with(&self, isa: Isa, x: &[f32], m: usize) -> Vec<f32> {
        let w = &self.packed;
        assert_eq!(x.len(), m * w.cols, "activation shape");
        let isa = if Isa::supported().contains(&isa) {
            isa
        } else {
            Isa::Scalar
        };
        let a = PackedActs::quantize(w.format, x, m, w.cols);
        let mut by_row = vec![0f32; w.rows * m];
        by_row
            .par_chunks_mut(ROWS_PER_TASK * m)
            .enumerate()
            .for_each(|(task, out)| {
                let first = task * ROWS_PER_TASK;
                let n = out.len() / m;
                let mut i = 0;
                while i < n {
                    let rows = if n - i >= TILE_ROWS { TILE_ROWS } else { 1 };
                    let mut t = 0;
                    while t < m {
                        let toks = if m - t >= TILE_TOKENS { TILE_TOKENS } else { 1 };
                        let mut put = |r: usize, k: usize, v: f32| out[(i + r) * m + t + k] = v;
                        match (rows, toks) {
                            (TILE_ROWS, TILE_TOKENS) => {
                                let v = tile::<TILE_ROWS, TILE_TOKENS>(isa, w, first + i, &a, t);
                                for (r, row) in v.iter().enumerate() {
                                    row.iter().enumerate().for_each(|(k, v)| put(r, k, *v));
                                }
                            }
                            (TILE_ROWS, _) => {
                                let v = tile::<TILE_ROWS, 1>(isa, w, first + i, &a, t);
                                (0..TILE_ROWS).for_each(|r| put(r, 0, v[r][0]));
                            }
                            (_, TILE_TOKENS) => {
                                let v = tile::<1, TILE_TOKENS>(isa, w, first + i, &a, t);
                                (0..TILE_TOKENS).for_each(|k| put(0, k, v[0][k]));
                            }
                            _ => put(0, 0, tile::<1, 1>(isa, w, first + i, &a, t)[0][0]),
                        }
                        t += toks;
                    }
                    i += rows;
                }
            });
        if m == 1 {
            return by_row;
        }
        let mut out = vec![0f32; m * w.rows];
        for (r, vals) in by_row.chunks_exact(m).enumerate() {
            for (t, v) in vals.iter().enumerate() {
                out[t * w.rows + r] = *v;
            }
        }
        out
    }
}

/// One tile through the chosen implementation.
fn tile<const R: usize, const T: usize>(
    isa: Isa,
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; R] {
    assert!(r0 + R <= w.rows && (t0 + T) * a.pairs * 2 <= a.d.len() && a.pairs == w.pairs);
    match (isa, w.format) {
        // SAFETY: `isa` is one this CPU supports (checked by the caller); rows, activation
        // rows and widths are checked above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightFormat::Q4_1) => unsafe {
            crate::cpu::avx512::q4_1::<R, T>(w, r0, a, t0)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightFormat::Q8_0) => unsafe {
            crate::cpu::avx512::q8_0::<R, T>(w, r0, a, t0)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightFormat::Q4_1) => unsafe { crate::cpu::avx2::q4_1::<R, T>(w, r0, a, t0) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightFormat::Q8_0) => unsafe { crate::cpu::avx2::q8_0::<R, T>(w, r0, a, t0) },
        _ => scalar::tile::<R, T>(w, r0, a, t0),
    }
}
