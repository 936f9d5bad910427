//! The collective operations that join tensor-parallel shards.

use candle_core::{Device, Tensor};

use crate::error::Result;

/// Precision of the data exchanged by all-reduce. The communicators of this crate
/// (`LocalComm`, `DeviceComm`) sum in rank order, so their results never depend on thread
/// timing; NCCL chooses its own reduction order (ring or tree, by message size and
/// topology) and promises none, so its sums may change with either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllReduceDtype {
    /// Exact f32 partial sums (the default on CPU).
    #[default]
    F32,
    /// Partial sums rounded to bf16 before the exchange: half the traffic, ~3 significant
    /// digits per partial sum.
    Bf16,
}

impl std::str::FromStr for AllReduceDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            other => Err(format!(
                "unknown all-reduce dtype '{other}' (use f32 or bf16)"
            )),
        }
    }
}

/// How ranks that share one GPU are joined (`--same-gpu-comm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SameGpuComm {
    /// The same-GPU communicator: the ranks' buffers summed in rank order on the device.
    #[default]
    Device,
    /// NCCL, as ranks on distinct GPUs are joined (needs NCCL 2.30 and
    /// `NCCL_MULTI_RANK_GPU_ENABLE=1`).
    Nccl,
}

impl std::str::FromStr for SameGpuComm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "device" => Ok(Self::Device),
            "nccl" => Ok(Self::Nccl),
            other => Err(format!(
                "unknown same-GPU communicator '{other}' (use device or nccl)"
            )),
        }
    }
}

impl std::fmt::Display for SameGpuComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Device => "device",
            Self::Nccl => "nccl",
        })
    }
}

/// What a worker thread needs to join its group. Sent to the worker, which connects on
/// its own thread with its own device: device communicators (NCCL) belong to the thread
/// that made them, launch on that thread's stream, and are never moved between threads.
pub trait Endpoint: Send {
    fn connect(self: Box<Self>, device: &Device) -> Result<Box<dyn Communicator>>;
}

/// One rank's endpoint in a group. Every rank of a group must call the same collectives
/// in the same order; a rank that fails calls [`Communicator::abort`] so the others return
/// an error instead of waiting forever. Collectives take and return tensors on the rank's
/// own device. On a GPU they may only be queued on the rank's stream when they return;
/// [`Communicator::settle`] waits for them, bounded by the step timeout.
pub trait Communicator {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Element-wise sum over ranks; every rank gets the sum.
    fn all_reduce_sum(&mut self, x: &Tensor) -> Result<Tensor>;
    /// Concatenation of every rank's `x` along `dim`, in rank order (sizes along `dim` may
    /// differ between ranks).
    fn all_gather(&mut self, x: &Tensor, dim: usize) -> Result<Tensor>;
    /// `root`'s `x` on every rank (all ranks pass a tensor of the same shape).
    fn broadcast(&mut self, x: &Tensor, root: usize) -> Result<Tensor>;
    /// Returns once every rank has arrived.
    fn barrier(&mut self) -> Result<()>;
    /// Fails every pending and future collective of the group with `reason`. An aborted
    /// group stays aborted; the engine replaces it with a fresh one (new endpoints for
    /// every rank) when the failure spoilt only the step.
    fn abort(&self, reason: &str);
    /// Why a CUDA graph cannot record this communicator's collectives, if it cannot. A
    /// group of one rank has none to record; a host communicator's run again when an
    /// emulated rank replays a step.
    fn graph_refusal(&self) -> Option<String> {
        (self.world_size() > 1).then(|| "its collectives synchronize with the host".to_string())
    }
    /// Waits until the collectives this rank has queued have completed; fails (and aborts
    /// the group) when they do not within the step timeout or when the group was
    /// aborted meanwhile. Collectives that complete before returning need nothing here.
    fn settle(&mut self) -> Result<()> {
        Ok(())
    }
}
