//! Query and key RMSNorm weights: per head (Qwen3, Gemma 3), or across all of a token's
//! heads (OLMo 2), whose sums of squares the ranks that split the heads add up.

use candle_core::{Device, Tensor};

use crate::error::{EngineError, Result};
use crate::tp::{Communicator, ShardPlan};

/// Weights of the query and key RMSNorm (Qwen3, Gemma 3: per head; OLMo 2: across
/// heads): on the host for CPU ranks, and as f32 tensors on the device for CUDA ranks.
#[derive(Debug, Clone)]
pub(crate) struct HeadNorms {
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    /// Set when the norms span all heads: how this rank's share of a token's sums of
    /// squares adds up to the whole across ranks.
    pub(crate) across: Option<AcrossHeads>,
    #[cfg_attr(
        not(any(feature = "cuda", feature = "gpu-emulation")),
        allow(dead_code)
    )]
    pub(crate) on_device: Option<DeviceNorms>,
}

/// The norms as f32 tensors on a CUDA rank's device.
#[derive(Debug, Clone)]
#[cfg_attr(
    not(any(feature = "cuda", feature = "gpu-emulation")),
    allow(dead_code)
)]
pub(crate) struct DeviceNorms {
    pub(crate) q: Tensor,
    pub(crate) k: Tensor,
    /// OLMo 2: [`AcrossHeads::k_share`] as `[1, local KV heads]`, uploaded once.
    pub(crate) k_share: Option<Tensor>,
}

/// OLMo 2's query and key norms over all of a token's heads, computed on heads split
/// among ranks: each rank sums the squares of its heads, the ranks' sums are all-reduced,
/// and each rank scales its heads by the whole's RMS.
#[derive(Debug, Clone)]
pub(crate) struct AcrossHeads {
    /// Dimensions the query and key norms span (heads · head_dim, all ranks together).
    pub(crate) q_dims: usize,
    pub(crate) k_dims: usize,
    /// Per local KV head: 1 / the number of ranks that hold it, so that a head replicated
    /// on several ranks counts once in the all-reduced sum.
    pub(crate) k_share: Vec<f32>,
}

impl HeadNorms {
    /// The norms as f32 tensors on `dev`.
    pub(crate) fn tensors(&self, dev: &Device) -> Result<DeviceNorms> {
        let k_share = self
            .across
            .as_ref()
            .map(|a| Tensor::from_slice(&a.k_share, (1, a.k_share.len()), dev))
            .transpose()?;
        Ok(DeviceNorms {
            q: Tensor::from_slice(&self.q, self.q.len(), dev)?,
            k: Tensor::from_slice(&self.k, self.k.len(), dev)?,
            k_share,
        })
    }

    /// The norms on a CUDA rank's device.
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    pub(crate) fn device_weights(&self) -> Result<&DeviceNorms> {
        self.on_device
            .as_ref()
            .ok_or_else(|| EngineError::Step("query/key norms were not loaded on the GPU".into()))
    }

    /// These norms for a rank on `dev`: CUDA ranks also get the weights as tensors.
    pub(crate) fn for_device(&self, dev: &Device) -> Result<Self> {
        let on_device = if dev.is_cuda() {
            Some(self.tensors(dev)?)
        } else {
            None
        };
        Ok(Self {
            on_device,
            ..self.clone()
        })
    }

    /// OLMo 2's norms for `rank`: its heads' slices of weights spanning all heads.
    pub(crate) fn across_heads(
        q: &[f32],
        k: &[f32],
        plan: &ShardPlan,
        rank: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let shard = plan.ranks.get(rank).ok_or_else(|| {
            EngineError::Parallel(format!("no rank {rank} in a plan of {}", plan.world_size))
        })?;
        let slice = |w: &[f32], heads: &std::ops::Range<usize>, name: &str| -> Result<Vec<f32>> {
            w.get(heads.start * head_dim..heads.end * head_dim)
                .map(<[f32]>::to_vec)
                .ok_or_else(|| {
                    EngineError::Parallel(format!("{name}: heads {heads:?} out of range"))
                })
        };
        let k_share = shard
            .kv_heads
            .clone()
            .map(|h| {
                let holders = plan
                    .ranks
                    .iter()
                    .filter(|r| r.kv_heads.contains(&h))
                    .count();
                1.0 / holders.max(1) as f32
            })
            .collect();
        Ok(Self {
            q: slice(q, &shard.q_heads, "q_norm")?,
            k: slice(k, &shard.kv_heads, "k_norm")?,
            across: Some(AcrossHeads {
                q_dims: q.len(),
                k_dims: k.len(),
                k_share,
            }),
            on_device: None,
        })
    }
}

/// Normalizes `n` tokens' queries (`q`, `[n, local heads · hd]`) and keys in place with
/// OLMo 2's norms across heads: each rank's sums of squares are all-reduced first.
pub(crate) fn norm_across_heads(
    q: &mut [f32],
    k: &mut [f32],
    n: usize,
    norms: &HeadNorms,
    across: &AcrossHeads,
    comm: &mut dyn Communicator,
    eps: f32,
) -> Result<()> {
    let (qw, kw) = (norms.q.len(), norms.k.len());
    let hd = kw / across.k_share.len().max(1);
    let mut sums = Vec::with_capacity(2 * n);
    for t in 0..n {
        let qs: f32 = q[t * qw..(t + 1) * qw].iter().map(|v| v * v).sum();
        let ks: f32 = k[t * kw..(t + 1) * kw]
            .chunks_exact(hd.max(1))
            .zip(&across.k_share)
            .map(|(head, share)| share * head.iter().map(|v| v * v).sum::<f32>())
            .sum();
        sums.extend([qs, ks]);
    }
    let sums = Tensor::from_vec(sums, (n, 2), &Device::Cpu)?;
    let total = comm.all_reduce_sum(&sums)?.to_vec2::<f32>()?;
    for (t, row) in total.iter().enumerate() {
        let scale = |sum: f32, dims: usize| 1.0 / (sum / dims as f32 + eps).sqrt();
        let (sq, sk) = (scale(row[0], across.q_dims), scale(row[1], across.k_dims));
        for (v, w) in q[t * qw..(t + 1) * qw].iter_mut().zip(&norms.q) {
            *v *= sq * w;
        }
        for (v, w) in k[t * kw..(t + 1) * kw].iter_mut().zip(&norms.k) {
            *v *= sk * w;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::model::ModelConfig;
    use crate::tp::PlanOptions;

    /// Four ranks over 4 query heads and 2 KV heads of 2: each KV head is held by two
    /// ranks and counts half on each; the query weights are sliced by each rank's heads.
    #[test]
    fn replicated_kv_heads_count_once_across_ranks() -> Result<()> {
        let config = ModelConfig {
            vocab_size: 16,
            hidden_size: 8,
            intermediate_size: 8,
            num_layers: 1,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 2,
            rotary_dim: 2,
            ..ModelConfig::default()
        };
        let plan = ShardPlan::new(&config, &PlanOptions::equal(4, 1))?;
        assert_eq!(plan.ranks[2].kv_heads, 1..2);
        let (q, k): (Vec<f32>, Vec<f32>) = ((0..8).map(|v| v as f32).collect(), vec![1.0; 4]);
        let norms = HeadNorms::across_heads(&q, &k, &plan, 2, 2)?;
        assert_eq!((norms.q, norms.k), (vec![4.0, 5.0], vec![1.0, 1.0]));
        let across = norms.across.expect("across heads");
        assert_eq!(
            (across.q_dims, across.k_dims, across.k_share),
            (8, 4, vec![0.5])
        );
        Ok(())
    }
}
