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

use crate::model::decoder::Pooled;
use crate::model::{Batch, DecoderShard, RankCache};
use crate::stats::{RankStats, TimedComm};
use crate::tp::{Communicator, Endpoint};

mod graphs;
mod logits;
mod mtp;

use graphs::{replayed, Graphs};
use logits::logits_to_host;
pub(crate) use logits::{Reduced, StepLogits, StepResult};
use mtp::MtpInputs;
pub(crate) use mtp::{MtpHidden, MtpJob};

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
                let recorded = graphs::record(plan, &shard, &mut cache, comm.as_mut(), rank);
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
