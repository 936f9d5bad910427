//! `DeviceComm`: collectives between ranks that are threads of one process sharing one
//! GPU, so that tensor parallelism over N ranks runs on a machine with a single GPU the
//! same sharded code it runs on N GPUs (NCCL refuses two ranks on one GPU).
//!
//! Each rank publishes its tensor with an event recorded on its stream after the work
//! that produced it, meets the others at an abortable barrier, then copies every rank's
//! tensor to its own device after waiting on that rank's event, and reduces in rank
//! order in f32: every rank computes the same sums in the same order, so all ranks hold
//! identical results and the result does not depend on thread timing. Before a rank
//! leaves a collective it waits for its own copies to finish, so no published buffer is
//! freed or replaced while a peer still reads it. Slots are double buffered by parity,
//! as in `LocalComm`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::cuda::cudarc::driver::{CudaEvent, CudaStream};
use candle_core::{DType, Device, Tensor};

use crate::error::{EngineError, Result};
use crate::tp::barrier::AbortableBarrier;
use crate::tp::comm::{AllReduceDtype, Communicator, Endpoint};
use crate::tp::gpu_wait::{wait_for_stream, WaitEnd};

/// A published tensor and the event after which it is complete.
type Published = Option<(Tensor, Arc<CudaEvent>)>;

struct Shared {
    world: usize,
    slots: [Vec<Mutex<Published>>; 2],
    barrier: AbortableBarrier,
    timeout: Duration,
}

/// One rank of a group on one GPU. Create the group with [`DeviceComm::group`]; each
/// rank connects on its worker thread with its own device.
pub struct DeviceComm {
    rank: usize,
    shared: Arc<Shared>,
    dtype: AllReduceDtype,
    sequence: u64,
    device: Option<Device>,
}

fn comm_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::CommAborted(format!("same-GPU {what}: {e}"))
}

impl DeviceComm {
    /// Endpoints for `world` ranks on one GPU. A collective waiting longer than
    /// `timeout` for the others fails, and so does a step whose GPU work does not finish
    /// within it ([`Communicator::settle`]).
    pub fn group(world: usize, dtype: AllReduceDtype, timeout: Duration) -> Vec<DeviceComm> {
        let slots = || (0..world).map(|_| Mutex::new(None)).collect();
        let shared = Arc::new(Shared {
            world,
            slots: [slots(), slots()],
            barrier: AbortableBarrier::new(world, timeout),
            timeout,
        });
        (0..world)
            .map(|rank| DeviceComm {
                rank,
                shared: shared.clone(),
                dtype,
                sequence: 0,
                device: None,
            })
            .collect()
    }

    fn device(&self) -> Result<&Device> {
        self.device
            .as_ref()
            .ok_or_else(|| EngineError::CommAborted("same-GPU communicator not connected".into()))
    }

    fn stream(&self) -> Result<Arc<CudaStream>> {
        match self.device()? {
            Device::Cuda(d) => Ok(d.cuda_stream()),
            _ => Err(EngineError::CommAborted(
                "the same-GPU communicator needs a CUDA device".into(),
            )),
        }
    }

    /// Publishes `x` (complete once this rank's queued work is) and waits for every rank.
    fn exchange(&mut self, x: Tensor) -> Result<usize> {
        let event = self
            .stream()?
            .record_event(None)
            .map_err(|e| comm_err("event", e))?;
        let parity = (self.sequence % 2) as usize;
        self.sequence += 1;
        *self.shared.slots[parity][self.rank]
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((x, Arc::new(event)));
        self.shared.barrier.wait(self.rank)?;
        Ok(parity)
    }

    /// Rank `r`'s published tensor, copied to this rank's device once it is complete.
    fn fetch(&self, parity: usize, r: usize) -> Result<Tensor> {
        let published = self.shared.slots[parity][r]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (tensor, event) = published
            .ok_or_else(|| EngineError::CommAborted(format!("rank {r} published nothing")))?;
        if r == self.rank {
            return Ok(tensor);
        }
        self.stream()?
            .wait(&event)
            .map_err(|e| comm_err("wait", e))?;
        Ok(tensor.to_device(self.device()?)?)
    }

    /// Waits until this rank's queued copies are done, so peers may reuse their buffers.
    fn finish_reads(&self) -> Result<()> {
        self.stream()?
            .synchronize()
            .map_err(|e| comm_err("synchronize", e))
    }
}

impl Endpoint for DeviceComm {
    fn connect(mut self: Box<Self>, device: &Device) -> Result<Box<dyn Communicator>> {
        if !device.is_cuda() {
            return Err(EngineError::Parallel(
                "the same-GPU communicator joins CUDA ranks only".into(),
            ));
        }
        self.device = Some(device.clone());
        Ok(self)
    }
}

impl Communicator for DeviceComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_sum(&mut self, x: &Tensor) -> Result<Tensor> {
        if self.shared.world == 1 {
            return Ok(x.clone());
        }
        let bf16 = self.dtype == AllReduceDtype::Bf16;
        let wire = if bf16 { DType::BF16 } else { DType::F32 };
        let mine = x.to_dtype(wire)?.contiguous()?;
        let parity = self.exchange(mine)?;
        let mut sum = self.fetch(parity, 0)?.to_dtype(DType::F32)?;
        for r in 1..self.shared.world {
            let other = self.fetch(parity, r)?;
            if other.dims() != x.dims() {
                return Err(EngineError::CommAborted(format!(
                    "all-reduce shape mismatch: rank {r} sent {:?}, rank {} sent {:?}",
                    other.dims(),
                    self.rank,
                    x.dims()
                )));
            }
            sum = (sum + other.to_dtype(DType::F32)?)?;
        }
        if bf16 {
            sum = sum.to_dtype(DType::BF16)?;
        }
        let out = sum.to_dtype(x.dtype())?;
        self.finish_reads()?;
        Ok(out)
    }

    fn all_gather(&mut self, x: &Tensor, dim: usize) -> Result<Tensor> {
        if self.shared.world == 1 {
            return Ok(x.clone());
        }
        let parity = self.exchange(x.contiguous()?)?;
        let parts = (0..self.shared.world)
            .map(|r| self.fetch(parity, r))
            .collect::<Result<Vec<_>>>()?;
        let out = Tensor::cat(&parts, dim)?;
        self.finish_reads()?;
        Ok(out)
    }

    fn broadcast(&mut self, x: &Tensor, root: usize) -> Result<Tensor> {
        if self.shared.world == 1 {
            return Ok(x.clone());
        }
        let parity = self.exchange(x.contiguous()?)?;
        let out = self.fetch(parity, root)?.copy()?;
        self.finish_reads()?;
        Ok(out)
    }

    fn barrier(&mut self) -> Result<()> {
        self.shared.barrier.wait(self.rank)
    }

    fn abort(&self, reason: &str) {
        self.shared.barrier.abort(reason);
    }

    /// Waits for this rank's queued GPU work with the group's timeout: a kernel that
    /// never finishes fails the step instead of hanging the worker.
    fn settle(&mut self) -> Result<()> {
        let stream = self.stream()?;
        let deadline = Instant::now() + self.shared.timeout;
        let reason = match wait_for_stream(&stream, deadline, || None) {
            Ok(()) => return Ok(()),
            Err(WaitEnd::TimedOut) => format!(
                "rank {}: GPU work did not finish within {:?}",
                self.rank, self.shared.timeout
            ),
            Err(WaitEnd::Interrupted(r) | WaitEnd::Failed(r)) => format!("rank {}: {r}", self.rank),
        };
        self.shared.barrier.abort(&reason);
        Err(EngineError::CommAborted(reason))
    }
}
