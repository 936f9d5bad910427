//! The reduction of a step's logit rows on the device (`kernels/cuda/argmax.cu`,
//! `candidates.cu`): each row to its arg-max, a temperature row to its sampling
//! candidates, and a log-sum-exp where log-probabilities are asked for, so that only a few
//! bytes per row cross to the host.

use candle_core::{DType, Tensor};
use tessera_kernels::gpu::launch::{
    argmax_shape, candidate_rows, candidate_slots_used, column_of_key, log_sum_exp_rows,
    CandidateRow, ARGMAX_KERNEL, CANDIDATES_KERNEL, EXP_SUMS_KERNEL, MAX_CANDIDATES,
};

use crate::device::buffers::{expect_dtype, prefix_to_host, Gpu, Held, Module};
use crate::error::{EngineError, Result};
use crate::model::cuda::kernels::i32_of;

/// What the device reduced a step's logit rows to.
#[derive(Debug, Default)]
pub struct Reductions {
    /// Each row's arg-max column, the lowest index winning ties as in the host sampler;
    /// 0 for a row whose values are all NaN.
    pub argmax: Vec<u32>,
    /// With temperatures, each row's sampling candidates (`sampler::sampling_candidates`:
    /// token and logit, by token); `None` for a row the host must take whole.
    pub candidates: Vec<Option<CandidateRow>>,
    /// When asked for, each row's log-sum-exp (NaN for a row with no finite best).
    pub log_sum_exp: Option<Vec<f32>>,
}

/// The arg-max of each row of f32 `logits` (`[rows, cols]`); given a temperature per
/// row, the row's sampling candidates; and if asked, its log-sum-exp: a kernel each, then
/// copies of a few bytes per row and of at most [`MAX_CANDIDATES`] pairs per candidate
/// row.
pub fn reduce_rows(
    gpu: Gpu<'_>,
    logits: &Tensor,
    temperatures: Option<&[f32]>,
    log_sum_exp: bool,
) -> Result<Reductions> {
    expect_dtype(logits, DType::F32, "logits")?;
    let (rows, cols) = logits.dims2()?;
    if rows == 0 || cols == 0 {
        return Ok(Reductions {
            argmax: vec![0; rows],
            candidates: vec![None; rows],
            log_sum_exp: log_sum_exp.then(|| vec![f32::NAN; rows]),
        });
    }
    let device = gpu.device();
    let cols_arg = i32_of(cols, "vocabulary size")?;
    let (shape, per_block) = argmax_shape(rows, cols);
    let per_block_arg = i32_of(per_block, "columns per block")?;
    // One zeroed 64-bit key per row (candle has no u64 tensors: i64 of the same bits).
    let keys = Tensor::zeros(rows, DType::I64, device)?;
    let (keys_h, logits_h) = (
        Held::new(&keys, "arg-max keys")?,
        Held::new(logits, "logits")?,
    );
    let args = [keys_h.arg()?, logits_h.arg()?, cols_arg, per_block_arg];
    // SAFETY: matches argmax.cu; `keys` holds one key per row and every block reads
    // columns below `cols` of its own row.
    unsafe { gpu.launch(Module::Argmax, ARGMAX_KERNEL, shape, &args) }?;
    // Queued before anything comes back to the host, so one wait covers every kernel.
    let blocks = shape.grid.0 as usize;
    let partials = if log_sum_exp {
        let partials = gpu.output(DType::F32, rows * blocks)?;
        let held = Held::new(&partials, "exp sums")?;
        let args = [
            held.arg()?,
            keys_h.arg()?,
            logits_h.arg()?,
            cols_arg,
            per_block_arg,
        ];
        // SAFETY: matches candidates.cu's row_exp_sums_f32, launched on the arg-max's
        // grid: one key per row, one partial per block of each row.
        unsafe { gpu.launch(Module::Candidates, EXP_SUMS_KERNEL, shape, &args) }?;
        drop(held);
        Some(partials)
    } else {
        None
    };
    let candidates = match temperatures {
        None => vec![None; rows],
        Some(t) => {
            if t.len() != rows {
                return Err(EngineError::Step(format!(
                    "{} temperatures for {rows} rows",
                    t.len()
                )));
            }
            let cap = MAX_CANDIDATES;
            let temps = Tensor::from_slice(t, rows, device)?;
            let counts = Tensor::zeros(rows, DType::U32, device)?;
            // The kernel writes the slots it counts, below `cap`; the host reads only
            // those (`candidate_rows`).
            let ids = gpu.output(DType::U32, rows * cap)?;
            let values = gpu.output(DType::F32, rows * cap)?;
            let held = [
                Held::new(&counts, "candidate counts")?,
                Held::new(&ids, "candidate ids")?,
                Held::new(&values, "candidate logits")?,
                Held::new(&temps, "temperatures")?,
            ];
            let args = [
                held[0].arg()?,
                held[1].arg()?,
                held[2].arg()?,
                keys_h.arg()?,
                logits_h.arg()?,
                held[3].arg()?,
                cols_arg,
                per_block_arg,
                i32_of(cap, "candidates per row")?,
            ];
            // SAFETY: matches candidates.cu, launched on the arg-max's grid: one key,
            // count and temperature per row, `cap` slots per row.
            unsafe { gpu.launch(Module::Candidates, CANDIDATES_KERNEL, shape, &args) }?;
            drop(held);
            let counts = counts.to_vec1::<u32>()?;
            // Only the slots the fullest row used come back (slot-major: one prefix).
            let used = candidate_slots_used(&counts, cap);
            let (ids, values) = if used == 0 {
                (Vec::new(), Vec::new())
            } else {
                (
                    prefix_to_host::<u32>(&ids, used * rows)?,
                    prefix_to_host::<f32>(&values, used * rows)?,
                )
            };
            candidate_rows(&counts, &ids, &values, cap)
        }
    };
    drop((keys_h, logits_h));
    let keys: Vec<u64> = keys
        .to_vec1::<i64>()?
        .into_iter()
        .map(|k| k as u64)
        .collect();
    let log_sum_exp = match partials {
        Some(p) => Some(log_sum_exp_rows(&p.to_vec1::<f32>()?, blocks, &keys)),
        None => None,
    };
    Ok(Reductions {
        argmax: keys.into_iter().map(column_of_key).collect(),
        candidates,
        log_sum_exp,
    })
}

/// The arg-max column of each row of f32 `logits` (`[rows, cols]`), the lowest index
/// winning ties as in the host sampler; rows whose values are all NaN give 0.
pub fn argmax_rows(gpu: Gpu<'_>, logits: &Tensor) -> Result<Vec<u32>> {
    Ok(reduce_rows(gpu, logits, None, false)?.argmax)
}
