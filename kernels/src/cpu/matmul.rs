//! `y = x Wᵀ` for block-quantized `W`: the activations are quantized once per call, then
//! each group of sixteen weight rows is a parallel task on the caller's rayon pool, which
//! passes its group over the activation rows in tiles of eight, then runs what is left
//! (1-7 rows) in tiles of four, two and one. Every (row, activation) pair is accumulated
//! in the same order whatever tile it falls in, so the result of a row does not depend on
//! the batch around it.

use rayon::prelude::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::isa::Isa;
use crate::cpu::layout::{PackedWeights, WeightFormat, PAIR, QK_K};
use crate::cpu::layout_wide::WIDE;
use crate::cpu::scalar;
use crate::cpu::tile_out::TileOut;

/// Activation rows per full tile; a remainder runs in tiles of four, two and one, so a
/// decode batch or a speculative check of 2-7 rows shares each pass over the weights
/// between rows instead of streaming the group once per row.
const TILE_TOKENS: usize = 8;

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
        check_shapes(w, &a);
        let (rows, m) = (w.rows, a.rows);
        // Not zeroed first: every element is written once below (each task owns its
        // rows and passes every activation row over them), and the zeroing cost 2-3% of
        // a batched decode step's time with a 262144-row LM head.
        let mut out: Vec<f32> = Vec::with_capacity(m * rows);
        let dst = Output(out.as_mut_ptr());
        let groups = w.padded_rows() / WIDE;
        // A few runs of tasks per thread: a decode task is well under a microsecond, and
        // every split rayon makes is a job another thread must be woken for and steal.
        let min_len = (groups / (4 * rayon::current_num_threads())).max(1);
        (0..groups)
            .into_par_iter()
            .with_min_len(min_len)
            .for_each(|group| {
                let r0 = group * WIDE;
                let live = (rows - r0).min(WIDE);
                let mut t = 0;
                while t < m {
                    // SAFETY: rows `t..t + tile`, columns `r0..r0 + live` are inside
                    // `[m, rows]`, and each output column belongs to exactly one task, so
                    // no two tiles write the same element.
                    let out = unsafe { TileOut::new(dst.at(t * rows + r0), rows, live) };
                    // The largest tile that fits the rows left.
                    t += match m - t {
                        TILE_TOKENS.. => {
                            tile::<TILE_TOKENS>(isa, w, r0, &a, t, out);
                            TILE_TOKENS
                        }
                        4.. => {
                            tile::<4>(isa, w, r0, &a, t, out);
                            4
                        }
                        2.. => {
                            tile::<2>(isa, w, r0, &a, t, out);
                            2
                        }
                        _ => {
                            tile::<1>(isa, w, r0, &a, t, out);
                            1
                        }
                    };
                }
            });
        // SAFETY: the loop above wrote all `m * rows` elements (rows `0..rows` of every
        // group, for every activation row) before returning.
        unsafe { out.set_len(m * rows) };
        out
    }
}

/// That `a` was quantized for `w`'s format and width: the kernels read its fields at
/// offsets derived from `w`. Checked once per matmul, not per tile.
fn check_shapes(w: &PackedWeights, a: &PackedActs) {
    let (k, q4_1) = (w.format.is_k(), w.format == WeightFormat::Q4_1);
    let values = if k { QK_K } else { PAIR };
    assert!(
        a.pairs == w.pairs
            && a.qs.len() == a.rows * a.pairs * values
            && a.d.len() == a.rows * a.pairs * if k { 1 } else { 2 }
            && (k || a.s.len() == a.d.len())
            && (k || q4_1 || a.block_corr.len() == a.d.len())
            && (!k || a.bsums.len() == a.rows * a.pairs * 16)
            && (!k || a.sums32.len() == a.rows * a.pairs * 8),
        "activations quantized for another matrix"
    );
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
    /// The element at `at`.
    fn at(self, at: usize) -> *mut f32 {
        self.0.wrapping_add(at)
    }
}

/// One group of sixteen weight rows times activation rows `t0..t0+T`, into `out` (a
/// tile of `T` rows), through the chosen implementation; `a` passed [`check_shapes`]
/// for `w`.
fn tile<const T: usize>(
    isa: Isa,
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
    out: TileOut,
) {
    assert!(r0.is_multiple_of(WIDE) && r0 < w.padded_rows() && t0 + T <= a.rows);
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu::avx512_wide::{Q4_1, Q5_0, Q8_0};
        use crate::cpu::{avx2_k, avx2_wide, avx512_k, avx512_wide};
        use Isa::{Avx2, Avx512Vnni};
        // SAFETY: `isa` is one this CPU supports (checked by the caller); the group and
        // activation rows are checked above, the format and widths by `check_shapes`.
        unsafe {
            match (isa, w.format) {
                (Avx512Vnni, WeightFormat::Q4_1) => {
                    return avx512_wide::tile::<Q4_1, T>(w, r0, a, t0, out)
                }
                (Avx512Vnni, WeightFormat::Q5_0) => {
                    return avx512_wide::tile::<Q5_0, T>(w, r0, a, t0, out)
                }
                (Avx512Vnni, WeightFormat::Q8_0) => {
                    return avx512_wide::tile::<Q8_0, T>(w, r0, a, t0, out)
                }
                (Avx512Vnni, WeightFormat::Q4K) => return avx512_k::q4k::<T>(w, r0, a, t0, out),
                (Avx512Vnni, WeightFormat::Q6K) => return avx512_k::q6k::<T>(w, r0, a, t0, out),
                (Avx2, WeightFormat::Q4_1) => return avx2_wide::tile::<Q4_1, T>(w, r0, a, t0, out),
                (Avx2, WeightFormat::Q5_0) => return avx2_wide::tile::<Q5_0, T>(w, r0, a, t0, out),
                (Avx2, WeightFormat::Q8_0) => return avx2_wide::tile::<Q8_0, T>(w, r0, a, t0, out),
                (Avx2, WeightFormat::Q4K) => return avx2_k::q4k::<T>(w, r0, a, t0, out),
                (Avx2, WeightFormat::Q6K) => return avx2_k::q6k::<T>(w, r0, a, t0, out),
                (Isa::Scalar, _) => {}
            }
        }
    }
    for (t, row) in scalar::tile::<WIDE, T>(w, r0, a, t0).iter().enumerate() {
        // SAFETY: `out` is a tile of `T` rows (caller).
        unsafe { out.put(t, row) };
    }
}
