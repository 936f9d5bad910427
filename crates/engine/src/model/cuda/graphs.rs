//! A rank's decode steps replayed from CUDA graphs ([`graph_plan`](super::graph_plan)
//! says which steps and how they are padded).
//!
//! Each graph reads its step from three buffers allocated once: each row's token, the
//! step's packed metadata (positions, slots, block tables, attention tiles) and each
//! row's logits, which the graph writes. Before a replay the host writes the padded step
//! into the first two with one copy each; after it, the sampled rows' logits are read from
//! the third as an eager step's are. Everything else a replay touches (weights, the KV
//! cache, the activations it allocates and frees on the device) has the addresses the
//! recording saw: a resized cache or a fresh communicator drops the graphs.
//!
//! On a CUDA rank each graph is recorded by stream capture after one eager run of the
//! same step (which loads every kernel and fills candle's cache of layout parameters, so
//! the capture copies nothing from the host), then replayed once over the same inputs:
//! its logits must be the eager run's, bit for bit, or the rank refuses its graphs. In
//! emulated test builds a replay runs that same step body from the same buffers, so
//! everything but the capture itself is tested on the host.

use std::collections::BTreeMap;

use candle_core::{DType, Tensor};

use super::graph_plan::{GraphKey, GraphPlan};
use super::step_meta::StepMeta;
use super::CudaKvCache;
use crate::device::buffers::Gpu;
use crate::error::{EngineError, Result};
use crate::model::batch::Batch;
use crate::model::step_meta::{PackedMeta, Part};
use crate::model::DecoderShard;
use crate::tp::Communicator;

/// One rank's recorded decode graphs and the buffers they read and write.
pub struct DecodeGraphs {
    plan: GraphPlan,
    /// u32 `[largest bucket]`: each row's token.
    tokens: Tensor,
    /// u32: the packed metadata of the step being replayed.
    meta: Tensor,
    /// f32 `[largest bucket, vocab]`: each row's logits.
    out: Tensor,
    /// Per graph, where each part of the metadata lies in `meta`.
    layouts: BTreeMap<GraphKey, PackedMeta>,
    #[cfg(feature = "cuda")]
    recorded: BTreeMap<GraphKey, candle_core::cuda::cudarc::driver::CudaGraph>,
}

impl std::fmt::Debug for DecodeGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeGraphs")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl DecodeGraphs {
    /// Records every graph of `plan` for `shard`, writing its KV into `cache`.
    pub fn record(
        plan: GraphPlan,
        shard: &DecoderShard,
        cache: &mut CudaKvCache,
        comm: &mut dyn Communicator,
    ) -> Result<Self> {
        if plan.scratch_block >= cache.num_blocks {
            return Err(EngineError::Config(format!(
                "scratch block {} outside a cache of {} blocks",
                plan.scratch_block, cache.num_blocks
            )));
        }
        let gpu = Gpu::of(shard.device())?;
        let rows = plan.buckets.last().copied().unwrap_or(1);
        let mut layouts = BTreeMap::new();
        for key in plan.keys() {
            let warm = plan.warm_up_batch(key.rows);
            layouts.insert(
                key,
                shard.graph_meta(&warm, plan.max_blocks(key.context), key)?,
            );
        }
        let meta_len = layouts.values().map(|l| l.values.len()).max().unwrap_or(1);
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut graphs = Self {
            tokens: gpu.output(DType::U32, rows)?,
            meta: gpu.output(DType::U32, meta_len)?,
            out: gpu.output(DType::F32, (rows, shard.vocab_size()))?,
            plan,
            layouts,
            #[cfg(feature = "cuda")]
            recorded: BTreeMap::new(),
        };
        let keys: Vec<GraphKey> = graphs.layouts.keys().copied().collect();
        for key in keys {
            let warm = graphs.plan.warm_up_batch(key.rows);
            graphs.write_inputs(gpu, &warm, key)?;
            #[cfg(feature = "cuda")]
            if let candle_core::Device::Cuda(dev) = shard.device() {
                let graph = capture(dev, || graphs.body(key, shard, cache, comm))?;
                graphs.check_replay(key, &graph)?;
                graphs.recorded.insert(key, graph);
                continue;
            }
            // The emulated rank runs the step once, as the recording would.
            graphs.body(key, shard, cache, comm)?;
        }
        Ok(graphs)
    }

    /// The graph that serves `batch`, if one does.
    pub fn key_for(&self, batch: &Batch) -> Option<GraphKey> {
        self.plan.key_for(batch)
    }

    /// How many graphs there are.
    pub fn len(&self) -> usize {
        self.layouts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layouts.is_empty()
    }

    /// Runs `batch` (which `key_for` gave `key`) from its graph: the logits of its rows,
    /// `[rows, vocab]`, valid until the next replay.
    pub fn replay(
        &self,
        key: GraphKey,
        batch: &Batch,
        shard: &DecoderShard,
        cache: &mut CudaKvCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        let gpu = Gpu::of(shard.device())?;
        let padded = self.plan.padded(batch, key.rows);
        self.write_inputs(gpu, &padded, key)?;
        #[cfg(feature = "cuda")]
        if let Some(graph) = self.recorded.get(&key) {
            graph
                .launch()
                .map_err(|e| EngineError::Step(format!("CUDA graph replay: {e}")))?;
            let _ = (cache, comm);
            return Ok(self.out.narrow(0, 0, batch.seqs.len())?);
        }
        self.body(key, shard, cache, comm)?;
        Ok(self.out.narrow(0, 0, batch.seqs.len())?)
    }

    /// Writes the padded step `batch` into the buffers graph `key` reads.
    fn write_inputs(&self, gpu: Gpu<'_>, batch: &Batch, key: GraphKey) -> Result<()> {
        let layout = self.layout(key)?;
        // The recording's layout holds the graph's launches and the rank's KV heads.
        let kv_of_q = &layout.values[layout.range(Part::KvOfQ)];
        let packed = PackedMeta::pack(batch, kv_of_q, layout.max_blocks, layout.plan.clone())?;
        if packed.ranges != layout.ranges {
            return Err(EngineError::Step(format!(
                "a step of {} rows does not fit the layout of graph {key:?}",
                batch.seqs.len()
            )));
        }
        gpu.write_u32(&self.tokens, &batch.token_ids)?;
        gpu.write_u32(&self.meta, &packed.values)
    }

    /// Replays `graph` once over the inputs its recording ran eagerly (still in the
    /// buffers, as are that run's logits): the same kernels on the same inputs, so the
    /// same bits, or the graph is refused before it serves anything.
    #[cfg(feature = "cuda")]
    fn check_replay(
        &self,
        key: GraphKey,
        graph: &candle_core::cuda::cudarc::driver::CudaGraph,
    ) -> Result<()> {
        use crate::device::buffers::prefix_to_host;
        let n = key.rows * self.out.dim(1)?;
        let eager = prefix_to_host::<f32>(&self.out, n)?;
        graph
            .launch()
            .map_err(|e| EngineError::Step(format!("CUDA graph replay: {e}")))?;
        let replayed = prefix_to_host::<f32>(&self.out, n)?;
        let differ = eager
            .iter()
            .zip(&replayed)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        if differ > 0 {
            return Err(EngineError::Step(format!(
                "graph {key:?}: a replay gave {differ} of {n} logits other than its eager run"
            )));
        }
        Ok(())
    }

    fn layout(&self, key: GraphKey) -> Result<&PackedMeta> {
        self.layouts
            .get(&key)
            .ok_or_else(|| EngineError::Step(format!("no decode graph {key:?}")))
    }

    /// The step graph `key` records, reading only the buffers.
    fn body(
        &self,
        key: GraphKey,
        shard: &DecoderShard,
        cache: &mut CudaKvCache,
        comm: &mut dyn Communicator,
    ) -> Result<()> {
        let meta = StepMeta::on_buffer(self.layout(key)?, cache.block_size, &self.meta);
        let tokens = self.tokens.narrow(0, 0, key.rows)?;
        shard.decode_graph_body(&tokens, &meta, cache, comm, &self.out)
    }
}

/// Records what `body` queues on the device's stream as a graph, after one eager run of
/// it.
#[cfg(feature = "cuda")]
fn capture(
    dev: &candle_core::CudaDevice,
    mut body: impl FnMut() -> Result<()>,
) -> Result<candle_core::cuda::cudarc::driver::CudaGraph> {
    use candle_core::cuda::cudarc::driver::sys;
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        EngineError::Step(format!("CUDA graph capture: {what}: {e}"))
    };
    let stream = dev.cuda_stream();
    // Layout parameters candle would copy from the host come from its cache, which the
    // eager run fills; kernels it launches are loaded by then too.
    let _cache = dev.enable_cuda_graph_htod_cache();
    body()?;
    stream
        .synchronize()
        .map_err(|e| fail("the eager run", &e))?;
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| fail("begin", &e))?;
    let ran = body();
    // The capture always ends, so the stream runs eagerly again whatever happened.
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    ran?;
    let graph = ended
        .map_err(|e| fail("instantiate", &e))?
        .ok_or_else(|| fail("end", &"nothing was recorded"))?;
    graph.upload().map_err(|e| fail("upload", &e))?;
    Ok(graph)
}

/// Bytes of graph memory the device holds now (the activations of recorded graphs).
#[cfg(feature = "cuda")]
pub fn graph_memory_bytes(dev: &candle_core::CudaDevice) -> Result<u64> {
    use candle_core::cuda::cudarc::driver::sys;
    let ctx = dev.cuda_stream().context().clone();
    let mut bytes: u64 = 0;
    // SAFETY: the attribute is a 64-bit value written to `bytes`.
    unsafe {
        sys::cuDeviceGetGraphMemAttribute(
            ctx.cu_device(),
            sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
            (&mut bytes as *mut u64).cast(),
        )
    }
    .result()
    .map_err(|e| EngineError::Step(format!("graph memory: {e}")))?;
    Ok(bytes)
}
