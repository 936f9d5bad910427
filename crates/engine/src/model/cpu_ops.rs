//! The elementwise steps of a layer (RMSNorm, residual add, SiLU·up) on CPU f32 tensors,
//! run on the rank's own thread pool, one row per task, so a row's result never depends
//! on the batch around it. candle's versions of these ops hand large tensors to a
//! separate thread pool of its own whose threads then spin, and on a machine whose cores
//! the rank's threads already use, that spinning takes their time (a perf profile of a
//! 124-token prefill put 12% of all samples in it). Tensors elsewhere (other dtypes,
//! CUDA) take candle's ops.

use candle_core::{CpuStorage, Storage, Tensor};
use rayon::prelude::*;

use crate::error::Result;
use crate::model::fast_math::{gelu_tanh, silu};
use crate::model::simd::simd_dispatch;
use crate::spec::model::Activation;

/// Rows below this many values are computed without handing work to the pool.
const PAR_MIN_VALUES: usize = 16 * 1024;

/// `f` over the values of `t` when it is a contiguous CPU f32 tensor; otherwise `f` is
/// handed back unused.
fn try_cpu_f32<R, F: FnOnce(&[f32]) -> R>(t: &Tensor, f: F) -> std::result::Result<R, F> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(v)), Some((start, end))) => Ok(f(&v[start..end])),
        _ => Err(f),
    }
}

/// `f` over the values of `t` when it is a contiguous CPU f32 tensor.
fn with_cpu_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    try_cpu_f32(t, f).ok()
}

/// `out[r] = f(r, out row)` for every row of `cols` values, in parallel when large.
fn rows_mut(out: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() >= PAR_MIN_VALUES && cols > 0 {
        out.par_chunks_mut(cols)
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    } else {
        for (r, row) in out.chunks_mut(cols.max(1)).enumerate() {
            f(r, row);
        }
    }
}

simd_dispatch! {
    /// `x · w / sqrt(mean(x²) + eps)` of one row into `out`.
    fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        // Eight running sums, so the loop vectorizes.
        let mut lanes = [0f32; 8];
        let mut chunks = x.chunks_exact(8);
        for c in &mut chunks {
            for (l, v) in lanes.iter_mut().zip(c) {
                *l += v * v;
            }
        }
        let tail = chunks.remainder().iter().map(|v| v * v).sum::<f32>();
        let sum_sq = lanes.iter().sum::<f32>() + tail;
        let inv = 1.0 / (sum_sq / x.len() as f32 + eps).sqrt();
        for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
            *o = v * inv * g;
        }
    }
}

simd_dispatch! {
    /// `out = a + b`.
    fn add_row(a: &[f32], b: &[f32], out: &mut [f32]) {
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            *o = x + y;
        }
    }
}

simd_dispatch! {
    /// `out = GELU(gate) · up`, GELU's tanh approximation (`gelu_pytorch_tanh`).
    fn geglu_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = gelu_tanh(*g) * u;
        }
    }
}

simd_dispatch! {
    /// `out = SiLU(gate) · up`.
    fn swiglu_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = silu(*g) * u;
        }
    }
}

/// RMSNorm of every row of `x` (`[tokens, hidden]`) with weight `w`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let (n, h) = x.dims2()?;
    let fast = with_cpu_f32(x, |xs| {
        with_cpu_f32(w, |ws| {
            let mut out = vec![0f32; n * h];
            rows_mut(&mut out, h, |r, row| {
                rms_norm_row(&xs[r * h..(r + 1) * h], ws, eps, row)
            });
            out
        })
    })
    .flatten();
    match fast {
        Some(out) => Ok(Tensor::from_vec(out, (n, h), x.device())?),
        None => Ok(candle_nn::ops::rms_norm(x, w, eps)?),
    }
}

/// RMSNorm of each head of `x` in place: `x` holds whole heads of `w.len()` values (the
/// queries or keys of a step, `[tokens, heads, head_dim]`), each normalized on its own
/// with the shared weight `w` (Qwen3's per-head query/key norm).
pub fn rms_norm_heads(x: &mut [f32], w: &[f32], eps: f32) {
    let hd = w.len().max(1);
    let mut normed = vec![0f32; hd];
    for head in x.chunks_exact_mut(hd) {
        rms_norm_row(head, w, eps, &mut normed);
        head.copy_from_slice(&normed);
    }
}

/// `x + delta`.
pub fn add(x: &Tensor, delta: &Tensor) -> Result<Tensor> {
    let (n, h) = x.dims2()?;
    let fast = with_cpu_f32(x, |xs| {
        with_cpu_f32(delta, |ds| {
            let mut sum = vec![0f32; n * h];
            rows_mut(&mut sum, h, |r, row| {
                let at = r * h..(r + 1) * h;
                add_row(&xs[at.clone()], &ds[at], row)
            });
            sum
        })
    })
    .flatten();
    match fast {
        Some(sum) => Ok(Tensor::from_vec(sum, (n, h), x.device())?),
        None => Ok((x + delta)?),
    }
}

/// `act(gate) · up` of a fused `[tokens, 2·width]` output whose first `width` columns
/// are the gate and the rest the up projection: `[tokens, width]`.
pub fn gated_fused(gate_up: &Tensor, width: usize, act: Activation) -> Result<Tensor> {
    let (n, cols) = gate_up.dims2()?;
    let fast = if cols == 2 * width {
        with_cpu_f32(gate_up, |gu| {
            let mut out = vec![0f32; n * width];
            rows_mut(&mut out, width, |r, row| {
                let (gate, up) = gu[r * cols..(r + 1) * cols].split_at(width);
                match act {
                    Activation::Silu => swiglu_row(gate, up, row),
                    Activation::GeluTanh => geglu_row(gate, up, row),
                }
            });
            out
        })
    } else {
        None
    };
    match fast {
        Some(out) => Ok(Tensor::from_vec(out, (n, width), gate_up.device())?),
        None => {
            let gate = gate_up.narrow(1, 0, width)?;
            gated(&gate, &gate_up.narrow(1, width, cols - width)?, act)
        }
    }
}

/// `act(gate) · up` of two separate outputs.
pub fn gated(gate: &Tensor, up: &Tensor, act: Activation) -> Result<Tensor> {
    let gate = match act {
        Activation::Silu => gate.silu()?,
        // candle's `gelu` is the tanh approximation.
        Activation::GeluTanh => gate.gelu()?,
    };
    Ok((gate * up)?)
}

/// The columns `offset..offset + width` of every row of `y` (`[tokens, cols]`) as one
/// row-major vector.
pub fn columns_to_vec(y: &Tensor, offset: usize, width: usize) -> Result<Vec<f32>> {
    let (n, cols) = y.dims2()?;
    let fast = with_cpu_f32(y, |ys| {
        let mut out = Vec::with_capacity(n * width);
        for row in ys.chunks_exact(cols.max(1)).take(n) {
            out.extend_from_slice(&row[offset..offset + width]);
        }
        out
    });
    match fast {
        Some(out) => Ok(out),
        None => Ok(y
            .narrow(1, offset, width)?
            .contiguous()?
            .flatten_all()?
            .to_vec1::<f32>()?),
    }
}

/// The values of a `[tokens, cols]` tensor, row-major, borrowed when it is a contiguous
/// CPU f32 tensor and copied otherwise; `f` runs over them.
pub fn with_values<R>(x: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    match try_cpu_f32(x, f) {
        Ok(r) => Ok(r),
        Err(f) => Ok(f(&x.contiguous()?.flatten_all()?.to_vec1::<f32>()?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    type R = Result<()>;

    fn t(values: &[f32], rows: usize, cols: usize) -> Result<Tensor> {
        Ok(Tensor::from_slice(values, (rows, cols), &Device::Cpu)?)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
        let (a, b) = (
            a.flatten_all()?.to_vec1::<f32>()?,
            b.flatten_all()?.to_vec1::<f32>()?,
        );
        assert_eq!(a.len(), b.len());
        Ok(a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max))
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2000) as f32 / 250.0 - 4.0)
            .collect()
    }

    #[test]
    fn ops_match_candle_small_and_large() -> R {
        for (n, h) in [(3, 64), (64, 576)] {
            let x = t(&values(n * h, 1), n, h)?;
            let d = t(&values(n * h, 2), n, h)?;
            let w = Tensor::from_vec(values(h, 3), h, &Device::Cpu)?;
            let want = candle_nn::ops::rms_norm(&x, &w, 1e-5)?;
            assert!(max_diff(&rms_norm(&x, &w, 1e-5)?, &want)? < 1e-5);
            let want_sum = (&x + &d)?;
            assert_eq!(max_diff(&add(&x, &d)?, &want_sum)?, 0.0);
        }
        Ok(())
    }

    #[test]
    fn gated_fused_matches_candle() -> R {
        for (n, width) in [(2, 32), (40, 512)] {
            let gu = t(&values(n * 2 * width, 4), n, 2 * width)?;
            let (gate, up) = (gu.narrow(1, 0, width)?, gu.narrow(1, width, width)?);
            for (act, want) in [
                (Activation::Silu, (gate.silu()? * &up)?),
                (Activation::GeluTanh, (gate.gelu()? * &up)?),
            ] {
                let diff = max_diff(&gated_fused(&gu, width, act)?, &want)?;
                assert!(diff < 1e-5, "{act:?}: {diff}");
            }
        }
        Ok(())
    }

    #[test]
    fn columns_are_cut_row_by_row() -> R {
        let y = t(&[1., 2., 3., 4., 5., 6.], 2, 3)?;
        let cut = |y: &Tensor, o, w| columns_to_vec(y, o, w);
        assert_eq!(cut(&y, 1, 2)?, vec![2., 3., 5., 6.]);
        let narrowed = y.narrow(1, 1, 2)?;
        assert_eq!(cut(&narrowed, 0, 1)?, vec![2., 5.]);
        let copied = with_values(&narrowed, |v| v.to_vec())?;
        assert_eq!(copied, vec![2., 3., 5., 6.]);
        Ok(())
    }
}
