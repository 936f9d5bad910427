//! `y = x Wᵀ` for block-quantized `W`: the activations are quantized once per call, then
//! output rows are split into parallel tasks on the caller's rayon pool. Inside a task,
//! tiles of one group of four weight rows × four activation rows (Q8_0: sixteen rows ×
//! eight activation rows) share their loads; every
//! (row, activation) pair is accumulated in the same order whatever tile it falls in, so
//! the result of a row does not depend on the batch around it.

use rayon::prelude::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::isa::Isa;
use crate::cpu::layout::{PackedWeights, WeightFormat, GROUP};
use crate::cpu::layout_q8::WIDE;
use crate::cpu::scalar;

/// Output rows per parallel task (a multiple of [`GROUP`] and of [`WIDE`]).
const ROWS_PER_TASK: usize = 16;
/// Activation rows per tile of four weight rows.
const TILE_TOKENS: usize = 4;
/// Activation rows per tile of sixteen Q8_0 weight rows.
const WIDE_TILE_TOKENS: usize = 8;
/// Activation rows a task's weight groups pass over together (a multiple of
/// [`TILE_TOKENS`]; 32 rows of 576 values are 18 KiB quantized).
const TOKEN_BLOCK: usize = 32;

/// A `[rows, cols]` weight matrix in one of the supported block formats.
#[derive(Debug, Clone)]
pub struct QuantWeights {
    packed: PackedWeights,
}

impl QuantWeights {
    /// Parses a row-major GGUF tensor of `rows × cols` (cols a multiple of the format's
    /// block: 32 values, 256 for the k-quants).
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
        if w.format == WeightFormat::Q8_0 {
            run::<WIDE, WIDE_TILE_TOKENS>(
                w,
                &a,
                |r0, t| tile_wide::<WIDE_TILE_TOKENS>(isa, w, r0, &a, t),
                |r0, t| tile_wide::<1>(isa, w, r0, &a, t),
            )
        } else {
            run::<GROUP, TILE_TOKENS>(
                w,
                &a,
                |r0, t| tile::<TILE_TOKENS>(isa, w, r0, &a, t),
                |r0, t| tile::<1>(isa, w, r0, &a, t),
            )
        }
    }
}

/// The parallel loop over tasks of [`ROWS_PER_TASK`] rows, each passing its groups of `R`
/// rows over blocks of activation rows, `TT` activation rows per tile (`tile_one` for the
/// remainder).
fn run<const R: usize, const TT: usize>(
    w: &PackedWeights,
    a: &PackedActs,
    tile_many: impl Fn(usize, usize) -> [[f32; TT]; R] + Sync,
    tile_one: impl Fn(usize, usize) -> [[f32; 1]; R] + Sync,
) -> Vec<f32> {
    let (rows, m) = (w.rows, a.rows);
    let mut out = vec![0f32; m * rows];
    let dst = Output(out.as_mut_ptr());
    let tasks = w.padded_rows().div_ceil(ROWS_PER_TASK);
    // A few runs of tasks per thread: a decode task is well under a microsecond, and
    // every split rayon makes is a job another thread must be woken for and steal.
    let min_len = (tasks / (4 * rayon::current_num_threads())).max(1);
    (0..tasks)
        .into_par_iter()
        .with_min_len(min_len)
        .for_each(|task| {
            let first = task * ROWS_PER_TASK;
            let last = (first + ROWS_PER_TASK).min(w.padded_rows());
            // Activation rows in blocks that stay in L1 while the task's weight groups
            // pass over them.
            for block in (0..m).step_by(TOKEN_BLOCK) {
                let block_end = (block + TOKEN_BLOCK).min(m);
                for r0 in (first..last).step_by(R) {
                    let live = rows.saturating_sub(r0).min(R);
                    let mut t = block;
                    while t < block_end {
                        let put = |r: usize, k: usize, v: f32| {
                            // SAFETY: `(t + k, r0 + r)` is inside `[m, rows]` (`r < live`),
                            // and each row belongs to exactly one task, so no two writes
                            // alias.
                            unsafe { dst.write((t + k) * rows + r0 + r, v) }
                        };
                        if block_end - t >= TT {
                            let v = tile_many(r0, t);
                            for (r, row) in v.iter().enumerate().take(live) {
                                row.iter().enumerate().for_each(|(k, v)| put(r, k, *v));
                            }
                            t += TT;
                        } else {
                            let v = tile_one(r0, t);
                            for (r, row) in v.iter().enumerate().take(live) {
                                put(r, 0, row[0]);
                            }
                            t += 1;
                        }
                    }
                }
            }
        });
    out
}

/// The output buffer, shared by tasks that write disjoint rows of it.
#[derive(Clone, Copy)]
struct Output(*mut f32);

// SAFETY: tasks write disjoint elements (each output row has one owner task), and the
// buffer outlives the parallel loop that uses it.
unsafe impl Send for Output {}
// SAFETY: as above.
unsafe impl Sync for Output {}

impl Output {
    /// # Safety
    /// `at` must be in bounds and written by no other thread.
    unsafe fn write(self, at: usize, v: f32) {
        // SAFETY: guaranteed by the caller.
        unsafe { *self.0.add(at) = v }
    }
}

/// One group of sixteen Q8_0 weight rows times activation rows `t0..t0+T`, through the
/// chosen implementation.
fn tile_wide<const T: usize>(
    isa: Isa,
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; WIDE] {
    assert!(
        w.format == WeightFormat::Q8_0
            && r0.is_multiple_of(WIDE)
            && r0 < w.padded_rows()
            && t0 + T <= a.rows
            && a.d.len() == a.rows * a.pairs * 2
            && a.block_corr.len() == a.d.len()
            && a.pairs == w.pairs
    );
    match isa {
        // SAFETY: `isa` is one this CPU supports (checked by the caller); the group,
        // activation rows and widths are checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { crate::cpu::avx512_q8::q8_0::<T>(w, r0, a, t0) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { crate::cpu::avx2_q8::q8_0::<T>(w, r0, a, t0) },
        _ => scalar::tile::<WIDE, T>(w, r0, a, t0),
    }
}

/// One group of four weight rows times activation rows `t0..t0+T`, through the chosen
/// implementation (every format but Q8_0).
fn tile<const T: usize>(
    isa: Isa,
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; GROUP] {
    let d_per_row = if w.format.is_k() { 1 } else { 2 };
    assert!(
        r0.is_multiple_of(GROUP)
            && r0 < w.padded_rows()
            && t0 + T <= a.rows
            && a.d.len() == a.rows * a.pairs * d_per_row
            && a.pairs == w.pairs
    );
    match (isa, w.format) {
        // SAFETY: `isa` is one this CPU supports (checked by the caller); the group,
        // activation rows and widths are checked above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightFormat::Q4_1) => unsafe {
            crate::cpu::avx512::q4_1::<T>(w, r0, a, t0)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightFormat::Q5_0) => unsafe {
            crate::cpu::avx512::q5_0::<T>(w, r0, a, t0)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightFormat::Q4K) => unsafe {
            crate::cpu::avx512_k::q4k::<T>(w, r0, a, t0)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, WeightFormat::Q6K) => unsafe {
            crate::cpu::avx512_k::q6k::<T>(w, r0, a, t0)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightFormat::Q4_1) => unsafe { crate::cpu::avx2::q4_1::<T>(w, r0, a, t0) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightFormat::Q5_0) => unsafe { crate::cpu::avx2::q5_0::<T>(w, r0, a, t0) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightFormat::Q4K) => unsafe { crate::cpu::avx2_k::q4k::<T>(w, r0, a, t0) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightFormat::Q6K) => unsafe { crate::cpu::avx2_k::q6k::<T>(w, r0, a, t0) },
        _ => scalar::tile::<GROUP, T>(w, r0, a, t0),
    }
}
