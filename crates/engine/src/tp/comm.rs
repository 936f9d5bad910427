//! The collective operations that join tensor-parallel shards.

use candle_core::Tensor;

use crate::error::Result;

/// Precision of the data exchanged by all-reduce. Summation order is fixed by rank in
/// every implementation, so results never depend on thread timing.
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

/// What a worker thread needs to join its group. Sent to the worker, which connects on
/// its own thread: device communicators (NCCL) belong to the thread that made them and
/// are never moved between threads.
pub trait Endpoint: Send {
    fn connect(self: Box<Self>) -> Result<Box<dyn Communicator>>;
}

/// One rank's endpoint in a group. Every rank of a group must call the same collectives
/// in the same order; a rank that fails calls [`Communicator::abort`] so the others return
/// an error instead of waiting forever (NCCL cannot wake peers already inside a
/// collective: there the engine's step timeout is the backstop).
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
    /// Fails every pending and future collective of the group with `reason`.
    fn abort(&self, reason: &str);
}
