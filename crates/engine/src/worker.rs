//! One worker thread per device. Each owns its model shard, its KV cache slice, its
//! communicator and its thread pool, receives batches over a channel and runs forward in
//! lock step with the others. A worker that fails (error or panic) aborts the group's
//! communicator so no other rank waits forever, tells the next pipeline stage (which
//! tells the one after it, so every stage hears), and reports an error naming its rank:
//! [`EngineError::Rank`] when only the step is spoilt, [`EngineError::GroupFailed`]
//! when its device is. After a step-only failure the engine hands every worker a fresh
//! endpoint ([`Job::Reconnect`]) and the group serves the next step.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::error::{EngineError, Result};
use candle_core::Tensor;

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
use crate::model::batch::RowReduce;
use crate::model::decoder::Pooled;
use crate::model::{Batch, DecoderShard, RankCache};
use crate::stats::{RankStats, TimedComm};
use crate::tp::{Communicator, Endpoint};

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
fn logits_to_host(logits: &Tensor, batch: &Batch, gpu_path: bool) -> Result<StepLogits> {
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

/// Test-only fault injection: make a rank fail in a chosen way on a chosen step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A plain error in the rank's step: fails the step only.
    Error,
    /// A panic in the rank's step: fails the step only.
    Panic,
    /// The rank stops answering: its peers time out and the group fails.
    Hang,
    /// The rank's device fails: the group fails.
    Device,
}

impl Fault {
    /// The fault as one byte on the wire between nodes.
    pub(crate) fn to_byte(self) -> u8 {
        match self {
            Fault::Error => 1,
            Fault::Panic => 2,
            Fault::Hang => 3,
            Fault::Device => 4,
        }
    }

    pub(crate) fn from_byte(b: u8) -> Option<Fault> {
        Some(match b {
            1 => Fault::Error,
            2 => Fault::Panic,
            3 => Fault::Hang,
            4 => Fault::Device,
            _ => return None,
        })
    }
}

pub(crate) enum Job {
    Step(Arc<Batch>),
    /// A pass of the MTP layer after a step ([`MtpJob`]).
    Mtp(Arc<MtpJob>),
    /// Arm `fault` on `rank` (the worker's own rank, or one of a worker node's).
    Inject {
        rank: usize,
        fault: Fault,
    },
    /// Join a fresh communicator after a failed step (the old one is aborted) and drop
    /// hidden states a stage sent for that step but nobody took.
    Reconnect(Box<dyn Endpoint>),
    /// Record the decode steps of this plan as CUDA graphs (answered once recorded, or
    /// with why not: an [`EngineError::Config`] when the rank cannot record them at all).
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    RecordGraphs(crate::model::cuda::graph_plan::GraphPlan),
    /// Drop the recorded graphs (another rank could not record them); no answer.
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    DropGraphs,
    /// Replace the KV cache with one of this many blocks (after sizing it to the device).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    ResizeCache {
        num_blocks: usize,
        block_size: usize,
    },
}

/// One pass of the model's MTP layer: its batch (each row's token is the one after its
/// position), and where each row's hidden state comes from.
#[derive(Debug)]
pub(crate) struct MtpJob {
    pub batch: Batch,
    pub hidden: MtpHidden,
    /// Per row of `batch`, its row in that source.
    pub rows: Vec<u32>,
}

/// Where an MTP pass reads its hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MtpHidden {
    /// The latest step's decoder output, by its rows (the final norm is applied).
    Model,
    /// The previous MTP pass's output at its sampled rows, by their order.
    Chain,
}

/// What a worker keeps between a step and the MTP passes after it (a shard with an MTP
/// layer only).
#[derive(Default)]
struct MtpInputs {
    /// The latest step's decoder output, `[tokens, hidden]`.
    model: Option<Tensor>,
    /// The latest MTP pass's output at its sampled rows.
    chain: Option<Tensor>,
}

impl MtpInputs {
    /// The MTP layer over `job`; the logits of its sampled rows.
    fn run(
        &mut self,
        shard: &DecoderShard,
        job: &MtpJob,
        cache: &mut RankCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        // Each source is read by one pass (the step's output by the first pass after it,
        // each pass's output by the next) and held no longer.
        let source = match job.hidden {
            MtpHidden::Model => self.model.take(),
            MtpHidden::Chain => self.chain.take(),
        };
        let source = source.ok_or_else(|| {
            EngineError::Step(format!(
                "an MTP pass before any {:?} hidden states",
                job.hidden
            ))
        })?;
        let rows = Tensor::from_slice(&job.rows, job.rows.len(), source.device())?;
        let mut hidden = source.index_select(&rows, 0)?;
        if job.hidden == MtpHidden::Model {
            hidden = shard.final_norm(&hidden)?;
        }
        let (y, logits) = shard.mtp(&job.batch, &hidden, cache, comm)?;
        let sampled: Vec<u32> = job.batch.sample_rows.iter().map(|r| *r as u32).collect();
        let sampled = Tensor::from_slice(&sampled, sampled.len(), y.device())?;
        self.chain = Some(y.index_select(&sampled, 0)?);
        Ok(logits)
    }
}

pub(crate) struct WorkerHandle {
    /// The first rank this worker runs.
    pub rank: usize,
    /// How many ranks it runs: 1 for a local rank, a node's ranks for a worker node's
    /// stand-in.
    pub span: usize,
    pub jobs: Sender<Job>,
    pub results: Receiver<StepResult>,
    pub thread: Option<JoinHandle<()>>,
}

/// What a worker runs for a job that computes.
enum Work {
    Step(Arc<Batch>),
    Mtp(Arc<MtpJob>),
}

/// Hidden states handed from one pipeline stage to the next, or why they never came.
pub(crate) type StageMsg = std::result::Result<Tensor, String>;

/// A pipeline stage's neighbours. Tensor-parallel ranks have neither.
#[derive(Default)]
pub(crate) struct StageLinks {
    /// Hidden states from the previous stage; the first stage embeds tokens instead.
    pub prev: Option<Receiver<StageMsg>>,
    /// Where this stage's output goes; the last stage applies the LM head instead.
    pub next: Option<Sender<StageMsg>>,
    /// Longest wait for the previous stage.
    pub timeout: std::time::Duration,
}

pub(crate) struct WorkerState {
    pub rank: usize,
    pub shard: DecoderShard,
    pub cache: RankCache,
    pub endpoint: Box<dyn Endpoint>,
    pub threads: usize,
    pub links: StageLinks,
    /// This worker hands the step's logits to the engine (TP rank 0, or the last stage).
    pub returns_logits: bool,
    pub stats: Arc<RankStats>,
}

/// The rank's recorded decode graphs, where it has them.
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
type Graphs = Option<crate::model::cuda::graphs::DecodeGraphs>;
#[cfg(not(any(feature = "cuda", feature = "gpu-emulation")))]
type Graphs = Option<std::convert::Infallible>;

/// The step replayed from a recorded graph, when one serves it: its logits.
#[cfg_attr(
    not(any(feature = "cuda", feature = "gpu-emulation")),
    allow(unused_variables)
)]
fn replayed(
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

/// One step on one worker: the whole model, or this stage's part of it.
#[allow(clippy::too_many_arguments)]
fn step(
    shard: &DecoderShard,
    batch: &Batch,
    cache: &mut RankCache,
    comm: &mut dyn Communicator,
    links: &StageLinks,
    returns_logits: bool,
    kept: &mut Option<Tensor>,
    (graphs, stats): (&Graphs, &RankStats),
) -> Result<Option<(Tensor, Vec<Pooled>)>> {
    // Graphs are recorded only by a rank that runs the whole model.
    if let Some(logits) = replayed(graphs, shard, batch, cache, comm)? {
        comm.settle()?;
        stats.record_graph_step();
        return Ok(Some((logits, Vec::new())));
    }
    let x = match &links.prev {
        None => shard.embed(batch)?,
        Some(rx) => match rx.recv_timeout(links.timeout) {
            // Stages may sit on different devices (GPUs, then the host).
            Ok(Ok(x)) => x.to_device(shard.device())?,
            // The rest of this stage's tensor-parallel group may already be waiting in a
            // collective for this rank: aborting the group releases it.
            Ok(Err(upstream)) => {
                comm.abort(&upstream);
                return Err(EngineError::CommAborted(upstream));
            }
            Err(_) => {
                let why = format!(
                    "no hidden states from the previous stage within {:?}",
                    links.timeout
                );
                comm.abort(&why);
                return Err(EngineError::CommAborted(why));
            }
        },
    };
    let x = shard.layers(x, batch, cache, comm)?;
    if shard.has_mtp() {
        *kept = Some(x.clone());
    }
    match &links.next {
        Some(tx) => {
            comm.settle()?;
            tx.send(Ok(x))
                .map_err(|_| EngineError::CommAborted("the next stage is gone".into()))?;
            Ok(None)
        }
        None => {
            let logits = shard.head(&x, batch, comm)?;
            comm.settle()?;
            let pooled = match returns_logits {
                true => shard.pool(&x, batch)?,
                false => Vec::new(),
            };
            Ok(Some((logits, pooled)))
        }
    }
}

/// Whether a rank's own error leaves its device unusable. CUDA errors are sticky (the
/// context fails every later call) and cannot be told apart here, so any tensor error
/// on a GPU counts; on the host a tensor error concerns only the step's data.
fn spoils_device(e: &EngineError, on_gpu: bool) -> bool {
    match e {
        EngineError::Device(_) => true,
        EngineError::Candle(_) => on_gpu,
        _ => false,
    }
}

pub(crate) fn spawn(state: WorkerState) -> Result<WorkerHandle> {
    let (job_tx, job_rx) = crossbeam_channel::unbounded::<Job>();
    let (res_tx, res_rx) = crossbeam_channel::unbounded::<StepResult>();
    let rank = state.rank;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(state.threads)
        .thread_name(move |i| format!("tessera-rank{rank}-{i}"))
        .build()
        .map_err(|e| EngineError::Rank {
            rank,
            message: format!("cannot build thread pool: {e}"),
        })?;
    let thread = std::thread::Builder::new()
        .name(format!("tessera-rank{rank}"))
        // The whole loop runs inside the rank's pool: the communicator is made and used on
        // one pool thread (device communicators must not move between threads), and the
        // kernels' parallel loops share that pool.
        .spawn(move || pool.install(|| run(state, job_rx, res_tx)))
        .map_err(|e| EngineError::Rank {
            rank,
            message: format!("cannot start worker thread: {e}"),
        })?;
    Ok(WorkerHandle {
        rank,
        span: 1,
        jobs: job_tx,
        results: res_rx,
        thread: Some(thread),
    })
}

fn run(st: WorkerState, jobs: Receiver<Job>, results: Sender<StepResult>) {
    let rank = st.rank;
    let WorkerState {
        shard,
        mut cache,
        endpoint,
        links,
        returns_logits,
        stats,
        ..
    } = st;
    let mut comm: Box<dyn Communicator> = match endpoint.connect(shard.device()) {
        Ok(c) => Box::new(TimedComm {
            inner: c,
            stats: stats.clone(),
        }),
        Err(e) => {
            // Fail every step: the engine reports this rank as the cause.
            let message = format!("cannot join the tensor-parallel group: {e}");
            while jobs.recv().is_ok() {
                let failure = Err(EngineError::GroupFailed {
                    rank: Some(rank),
                    message: message.clone(),
                });
                if results.send(failure).is_err() {
                    break;
                }
            }
            return;
        }
    };
    let on_gpu = shard.device().is_cuda();
    let gpu_path = shard.runs_gpu_path();
    let mut fault = None;
    let mut mtp = MtpInputs::default();
    let mut graphs: Graphs = None;
    while let Ok(job) = jobs.recv() {
        let work = match job {
            Job::Step(b) => Work::Step(b),
            Job::Mtp(m) => Work::Mtp(m),
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            Job::RecordGraphs(plan) => {
                graphs = None;
                let recorded = record_graphs(plan, &shard, &mut cache, comm.as_mut(), rank);
                let answer = recorded.map(|g| {
                    graphs = Some(g);
                    None
                });
                if results.send(answer).is_err() {
                    break;
                }
                continue;
            }
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            Job::DropGraphs => {
                graphs = None;
                continue;
            }
            Job::Inject { fault: f, .. } => {
                fault = Some(f);
                continue;
            }
            Job::Reconnect(endpoint) => {
                // The graphs hold the old communicator's collectives.
                graphs = None;
                if let Some(prev) = &links.prev {
                    while prev.try_recv().is_ok() {}
                }
                let joined = endpoint.connect(shard.device()).map(|inner| {
                    comm = Box::new(TimedComm {
                        inner,
                        stats: stats.clone(),
                    });
                    None
                });
                if results.send(joined).is_err() {
                    break;
                }
                continue;
            }
            Job::ResizeCache {
                num_blocks,
                block_size,
            } => {
                // The old cache goes first: on a GPU its memory is what the new one takes.
                // The new one starts uncalibrated (fp8): the engine's warm-up step, after
                // every resize, sets its scales.
                let dtype = cache.dtype();
                // The graphs write into the old cache.
                graphs = None;
                cache = RankCache::Cpu(crate::model::KvCache::empty(dtype, block_size));
                let resized = RankCache::new(&shard.cache_shape(dtype), num_blocks, block_size)
                    .map(|c| {
                        cache = c;
                        None
                    });
                if results.send(resized).is_err() {
                    break;
                }
                continue;
            }
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            match fault.take() {
                Some(Fault::Error) => return Err(EngineError::Step("injected fault".into())),
                Some(Fault::Panic) => panic!("injected panic"),
                Some(Fault::Device) => return Err(EngineError::Device("injected fault".into())),
                Some(Fault::Hang) => {
                    // Waits for the engine to shut down, like a stuck device would.
                    let _ = jobs.recv();
                    return Err(EngineError::Step("hung".into()));
                }
                None => {}
            }
            let started = std::time::Instant::now();
            let out = match &work {
                Work::Step(batch) => step(
                    &shard,
                    batch,
                    &mut cache,
                    comm.as_mut(),
                    &links,
                    returns_logits,
                    &mut mtp.model,
                    (&graphs, &stats),
                ),
                Work::Mtp(job) => mtp
                    .run(&shard, job, &mut cache, comm.as_mut())
                    .map(|logits| Some((logits, Vec::new()))),
            };
            stats.record_step(started.elapsed());
            out
        }));
        let batch = match &work {
            Work::Step(b) => b.as_ref(),
            Work::Mtp(m) => &m.batch,
        };
        let result = match outcome {
            Ok(Ok(Some((logits, pooled)))) if returns_logits => {
                logits_to_host(&logits, batch, gpu_path).map(|mut l| {
                    l.pooled = pooled;
                    Some(l)
                })
            }
            Ok(Ok(_)) => Ok(None),
            Ok(Err(e)) => Err(e),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(EngineError::Step(format!("panicked: {msg}")))
            }
        };
        let result = result.map_err(|e| {
            let (forwarded, failure) = match e {
                // Another rank or stage failed first and has said so.
                EngineError::CommAborted(m) => (m.clone(), EngineError::CommAborted(m)),
                other => {
                    let message = other.to_string();
                    comm.abort(&format!("rank {rank} failed: {message}"));
                    let failure = if spoils_device(&other, on_gpu) {
                        EngineError::GroupFailed {
                            rank: Some(rank),
                            message: message.clone(),
                        }
                    } else {
                        EngineError::Rank {
                            rank,
                            message: message.clone(),
                        }
                    };
                    (format!("stage {rank} failed: {message}"), failure)
                }
            };
            // Release the next stage, which waits for this one's output, whatever the
            // cause: it passes the word on, so the last stage hears it too. (A stage
            // that sent its output has succeeded: errors come before the send.)
            if let Some(next) = &links.next {
                let _ = next.send(Err(forwarded));
            }
            failure
        });
        if results.send(result).is_err() {
            break;
        }
    }
}

/// Records `plan`'s decode graphs on this rank, or says why it cannot. A failure while
/// recording aborts the group's communicator, as a failed step does.
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
fn record_graphs(
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
            #[cfg(feature = "cuda")]
            if let candle_core::Device::Cuda(dev) = shard.device() {
                let bytes = crate::model::cuda::graphs::graph_memory_bytes(dev).unwrap_or(0);
                tracing::info!(
                    "rank {rank}: {} decode graphs recorded in {:.2}s; graph memory {} MiB",
                    graphs.len(),
                    started.elapsed().as_secs_f64(),
                    bytes >> 20
                );
                return Ok(graphs);
            }
            tracing::debug!(
                "rank {rank}: {} decode graphs prepared in {:.2}s",
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
