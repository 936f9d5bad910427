//! A worker's decode graphs: recording them when the engine asks, and replaying a step
//! from one when one serves it.

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_core::Tensor;

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
use crate::error::EngineError;
use crate::error::Result;
use crate::model::{Batch, DecoderShard, RankCache};
use crate::tp::Communicator;

/// The rank's recorded decode graphs, where it has them.
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
pub(super) type Graphs = Option<crate::model::cuda::graphs::DecodeGraphs>;
#[cfg(not(any(feature = "cuda", feature = "gpu-emulation")))]
pub(super) type Graphs = Option<std::convert::Infallible>;

/// The step replayed from a recorded graph, when one serves it: its logits.
#[cfg_attr(
    not(any(feature = "cuda", feature = "gpu-emulation")),
    allow(unused_variables)
)]
pub(super) fn replayed(
    graphs: &Graphs,
    shard: &DecoderShard,
    batch: &Batch,
    cache: &mut RankCache,
    comm: &mut dyn Communicator,
) -> Result<Option<Tensor>> {
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    if let (Some(g), RankCache::Cuda(cache)) = (graphs, cache) {
        if let Some(key) = g.key_for(batch) {
            return g.replay(key, batch, shard, cache, comm).map(Some);
        }
    }
    Ok(None)
}

/// Records `plan`'s decode graphs on this rank, or says why it cannot. A failure while
/// recording aborts the group's communicator, as a failed step does.
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
pub(super) fn record(
    plan: crate::model::cuda::graph_plan::GraphPlan,
    shard: &DecoderShard,
    cache: &mut RankCache,
    comm: &mut dyn Communicator,
    rank: usize,
) -> Result<crate::model::cuda::graphs::DecodeGraphs> {
    use crate::model::cuda::graphs::DecodeGraphs;
    let refusal = shard.graph_refusal().or_else(|| comm.graph_refusal());
    let cache = match (refusal, cache) {
        (Some(why), _) => return Err(EngineError::Config(why)),
        (None, RankCache::Cuda(c)) => c,
        (None, RankCache::Cpu(_)) => {
            return Err(EngineError::Config(
                "the rank's KV cache is on the host".into(),
            ))
        }
    };
    let started = std::time::Instant::now();
    let recorded = catch_unwind(AssertUnwindSafe(|| {
        DecodeGraphs::record(plan, shard, cache, comm)
    }))
    .unwrap_or_else(|_| Err(EngineError::Step("panicked while recording graphs".into())));
    match recorded {
        Ok(graphs) => {
            // What the graphs hold on the device, where they are real ones.
            #[cfg(feature = "cuda")]
            let memory = match shard.device() {
                candle_core::Device::Cuda(dev) => {
                    crate::model::cuda::graphs::graph_memory_bytes(dev)
                        .map(|b| format!("; graph memory {} MiB", b >> 20))
                        .unwrap_or_default()
                }
                _ => String::new(),
            };
            #[cfg(not(feature = "cuda"))]
            let memory = "";
            tracing::info!(
                "rank {rank}: {} decode graphs recorded in {:.2}s{memory}",
                graphs.len(),
                started.elapsed().as_secs_f64()
            );
            Ok(graphs)
        }
        Err(e) => {
            comm.abort(&format!("rank {rank} failed to record decode graphs: {e}"));
            Err(EngineError::Rank {
                rank,
                message: format!("recording decode graphs: {e}"),
            })
        }
    }
}
