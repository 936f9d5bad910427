//! What the rank that returns logits hands back for a step: the sampled rows' logits on
//! the host, or what the device reduced them to.

use candle_core::Tensor;

use crate::error::Result;
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
use crate::model::batch::RowReduce;
use crate::model::decoder::Pooled;
use crate::model::Batch;

/// One sampled row as the device reduced it (only a GPU rank reduces rows).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    not(any(feature = "cuda", feature = "gpu-emulation")),
    allow(dead_code)
)]
pub(crate) enum Reduced {
    /// Its arg-max.
    Token(u32),
    /// Its sampling candidates: `(token, logit)` by token.
    Candidates(Vec<(u32, f32)>),
    /// Its arg-max, candidates and log-sum-exp ([`RowReduce::Scored`]).
    Scored {
        argmax: u32,
        candidates: Vec<(u32, f32)>,
        log_sum_exp: f32,
    },
}

/// What the rank that returns logits hands back for the step's sampled rows.
#[derive(Debug, Default)]
pub(crate) struct StepLogits {
    /// The logits of the rows that need them (`reduced[i]` is `None`), in row order,
    /// `vocab` values each.
    pub values: Vec<f32>,
    /// Per sampled row, what the device reduced it to, if it did.
    pub reduced: Vec<Option<Reduced>>,
    /// Per `batch.pool` span, in order, what it gives its sequence's embedding.
    pub pooled: Vec<Pooled>,
}

/// `Some` from the rank that returns logits, `None` from the others.
pub(crate) type StepResult = Result<Option<StepLogits>>;

/// The sampled rows' logits on the host. On a GPU, rows that need only their arg-max or
/// their sampling candidates (`batch.row_reduce`) are reduced there: copying every row's
/// logits (64 rows of a 128k vocabulary are 33 MB a step) and scanning them on one host
/// thread cost more than the forward pass itself.
pub(super) fn logits_to_host(logits: &Tensor, batch: &Batch, gpu_path: bool) -> Result<StepLogits> {
    let rows = logits.dim(0)?;
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    if gpu_path {
        let gpu = crate::device::buffers::Gpu::of(logits.device())?;
        let modes: Vec<RowReduce> = (0..rows)
            .map(|r| {
                batch
                    .row_reduce
                    .get(r)
                    .copied()
                    .unwrap_or(RowReduce::Logits)
            })
            .collect();
        if modes.iter().any(|m| *m != RowReduce::Logits) {
            return reduce_on_device(gpu, logits, &modes);
        }
    }
    #[cfg(not(any(feature = "cuda", feature = "gpu-emulation")))]
    let _ = (batch, gpu_path);
    Ok(StepLogits {
        values: logits.flatten_all()?.to_vec1::<f32>()?,
        reduced: vec![None; rows],
        pooled: Vec::new(),
    })
}

/// The rows reduced on the GPU as `modes` ask, and the whole rows of the others (and of
/// candidate rows the device could not reduce).
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
fn reduce_on_device(
    gpu: crate::device::buffers::Gpu<'_>,
    logits: &Tensor,
    modes: &[RowReduce],
) -> Result<StepLogits> {
    // 0 for a row without candidates: the kernel skips it.
    let temperatures: Vec<f32> = modes.iter().map(RowReduce::candidate_temperature).collect();
    let wants_candidates = temperatures.iter().any(|t| *t > 0.0);
    let wants_lse = modes.iter().any(|m| matches!(m, RowReduce::Scored { .. }));
    let r = crate::model::cuda::reductions::reduce_rows(
        gpu,
        logits,
        wants_candidates.then_some(&temperatures[..]),
        wants_lse,
    )?;
    let mut candidates = r.candidates.into_iter();
    let lse = r.log_sum_exp.unwrap_or_default();
    let reduced: Vec<Option<Reduced>> = modes
        .iter()
        .zip(&r.argmax)
        .enumerate()
        .map(|(row, (m, id))| {
            let cand = candidates.next().flatten();
            match m {
                RowReduce::Logits => None,
                RowReduce::Argmax => Some(Reduced::Token(*id)),
                RowReduce::Candidates { .. } => cand.map(Reduced::Candidates),
                // Fewer candidates than the most likely tokens asked for (a peaked row),
                // or no finite log-sum-exp: the host takes the row.
                RowReduce::Scored { top, .. } => {
                    let log_sum_exp = lse.get(row).copied().filter(|l| l.is_finite())?;
                    let candidates = cand.filter(|c| c.len() >= *top)?;
                    Some(Reduced::Scored {
                        argmax: *id,
                        candidates,
                        log_sum_exp,
                    })
                }
            }
        })
        .collect();
    let full: Vec<u32> = (0..reduced.len() as u32)
        .filter(|r| reduced[*r as usize].is_none())
        .collect();
    let values = if full.is_empty() {
        Vec::new()
    } else {
        let index = Tensor::from_slice(&full, full.len(), logits.device())?;
        logits
            .index_select(&index, 0)?
            .flatten_all()?
            .to_vec1::<f32>()?
    };
    Ok(StepLogits {
        values,
        reduced,
        pooled: Vec::new(),
    })
}
