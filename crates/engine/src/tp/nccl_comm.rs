//! `NcclComm`: collectives between GPUs over NCCL, on the CUDA buffers of the ranks'
//! tensors (feature `cuda`).
//!
//! One communicator per worker thread, initialised on that thread, on the stream its
//! kernels use, from a unique id shared by the group ([`NcclEndpoint`]); the ranks of a
//! node initialise concurrently. Across nodes the same 128-byte id travels over the
//! rendezvous, and each node makes its ranks' endpoints with [`NcclEndpoint::node_group`].
//!
//! Collectives are queued on the rank's stream and return at once. A failing rank calls
//! [`Communicator::abort`]: the group's ranks in this process see the flag, and every
//! rank waiting for its queued work ([`Communicator::settle`]) gives up when the flag is
//! set, when NCCL reports an asynchronous error, or at the step timeout; it then aborts
//! its communicator (`ncclCommAbort`), which releases collectives stuck on peers that
//! will never arrive. An aborted rank fails every later collective; after a failure that
//! spoils only the step, the engine gives every rank a fresh endpoint (a new unique id)
//! and the ranks initialise a new communicator together.
//!
//! Ranks that share one GPU (NCCL 2.30's several ranks per GPU) share its CUDA context
//! too, and that needs one more rule: an NCCL kernel spins on the GPU until its peers'
//! kernels arrive, and some host calls wait for all the context's running work first
//! (loading a kernel module, which candle and cuBLAS do at a kernel's first use; a
//! synchronous copy or free). A rank in such a call while a peer's collective spins
//! never reaches its own collective, and while such a call waits it holds the context,
//! so a peer cannot even queue its collective: both wait forever
//! (`scripts/gpu/nccl_context_probe.py` shows each case on a GPU). So ranks sharing a GPU
//! meet at a host gate before each collective and again once every rank has queued it:
//! no rank's collective starts while a peer may still make such a call before its own,
//! and no rank makes one while a peer has yet to queue. Ranks on distinct GPUs have
//! contexts of their own and meet only on the GPU.
//!
//! NCCL chooses its reduction order (ring or tree, by size and topology) and does not
//! promise one: unlike the in-process communicators, its sums are not fixed in rank
//! order, so results may change with the message size, the topology or the NCCL version.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::cuda::cudarc::driver::CudaStream;
use candle_core::cuda::cudarc::nccl::{result, safe::Id, sys};
use candle_core::{CudaDevice, DType, Device, Tensor};

use crate::device::buffers::{cuda_device, Gpu, Held};
use crate::error::{EngineError, Result};
use crate::tp::barrier::AbortableBarrier;
use crate::tp::comm::{AllReduceDtype, Communicator, Endpoint};
use crate::tp::gpu_wait::{wait_for_stream, WaitEnd};

fn nccl_err(what: &str, e: impl std::fmt::Debug) -> EngineError {
    EngineError::CommAborted(format!("NCCL {what}: {e:?}"))
}

/// Shared by the ranks of a group in this process: why the group was aborted, and for
/// ranks sharing one GPU the gate they pass before and after queueing each collective.
#[derive(Default)]
struct GroupState {
    aborted: Mutex<Option<String>>,
    gate: Option<AbortableBarrier>,
}

impl std::fmt::Debug for GroupState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupState")
            .field("aborted", &self.reason())
            .field("gated", &self.gate.is_some())
            .finish()
    }
}

impl GroupState {
    fn reason(&self) -> Option<String> {
        self.aborted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn abort(&self, reason: &str) {
        self.aborted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| reason.to_string());
        if let Some(gate) = &self.gate {
            gate.abort(reason);
        }
    }
}

/// What a worker needs to join an NCCL group: sendable, connected on the worker thread.
#[derive(Debug, Clone)]
pub struct NcclEndpoint {
    id: Id,
    rank: usize,
    world: usize,
    dtype: AllReduceDtype,
    timeout: Duration,
    group: Arc<GroupState>,
}

impl NcclEndpoint {
    /// Endpoints for `world` ranks of one node, sharing a fresh unique id. With
    /// `one_gpu` the ranks share one GPU, and meet at a host gate before and after
    /// queueing each collective (see the module's notes).
    pub fn group(
        world: usize,
        dtype: AllReduceDtype,
        timeout: Duration,
        one_gpu: bool,
    ) -> Result<Vec<Self>> {
        let group = GroupState {
            aborted: Mutex::new(None),
            gate: (one_gpu && world > 1).then(|| AbortableBarrier::new(world, timeout)),
        };
        let id = Self::new_id_bytes()?;
        Ok(Self::with_state(
            &id,
            0..world,
            world,
            dtype,
            timeout,
            group,
        ))
    }

    /// The endpoints of `ranks` in a group of `world` ranks from the group's unique id
    /// (its 128 bytes: fresh for one node, handed out by the leader at rendezvous across
    /// nodes). The ranks made here share their abort state, as the ranks of a process do.
    pub fn node_group(
        id: &[u8; 128],
        ranks: std::ops::Range<usize>,
        world: usize,
        dtype: AllReduceDtype,
        timeout: Duration,
    ) -> Vec<Self> {
        Self::with_state(id, ranks, world, dtype, timeout, GroupState::default())
    }

    fn with_state(
        id: &[u8; 128],
        ranks: std::ops::Range<usize>,
        world: usize,
        dtype: AllReduceDtype,
        timeout: Duration,
        group: GroupState,
    ) -> Vec<Self> {
        let id = Id::uninit(id.map(|b| b as std::ffi::c_char));
        let group = Arc::new(group);
        ranks
            .map(|rank| Self {
                id,
                rank,
                world,
                dtype,
                timeout,
                group: group.clone(),
            })
            .collect()
    }

    /// A fresh unique id for a group spanning nodes, as the bytes the leader sends.
    pub fn new_id_bytes() -> Result<[u8; 128]> {
        let id = Id::new().map_err(|e| nccl_err("unique id", e))?;
        Ok(id.internal().map(|c| c as u8))
    }
}

/// An initialised NCCL communicator. Dropping it aborts it: `ncclCommAbort` frees its
/// resources without waiting for peers, which may be gone.
struct RawComm(sys::ncclComm_t);

impl Drop for RawComm {
    fn drop(&mut self) {
        // SAFETY: the handle came from ncclCommInitRank and is dropped exactly once.
        let _ = unsafe { result::comm_abort(self.0) };
    }
}

impl Endpoint for NcclEndpoint {
    fn connect(self: Box<Self>, device: &Device) -> Result<Box<dyn Communicator>> {
        let dev = cuda_device(device)?.clone();
        let stream = dev.cuda_stream();
        // Initialisation needs the rank's context current on this thread.
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| nccl_err("context", e))?;
        let world = i32::try_from(self.world).map_err(|e| nccl_err("world size", e))?;
        let rank = i32::try_from(self.rank).map_err(|e| nccl_err("rank", e))?;
        let id = sys::ncclUniqueId {
            internal: *self.id.internal(),
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; every rank of the group calls this with
        // the same id and its own rank, each on its own thread.
        unsafe { result::comm_init_rank(&mut comm, world, id, rank) }
            .map_err(|e| nccl_err("init", e))?;
        tracing::info!(
            "rank {}: NCCL communicator ready ({} ranks)",
            self.rank,
            self.world
        );
        Ok(Box::new(NcclComm {
            comm: RefCell::new(Some(RawComm(comm))),
            dev,
            stream,
            rank: self.rank,
            world: self.world,
            dtype: self.dtype,
            timeout: self.timeout,
            group: self.group,
        }))
    }
}

/// One GPU rank's NCCL communicator. Not `Send`: it lives and dies on its worker thread.
pub struct NcclComm {
    comm: RefCell<Option<RawComm>>,
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
    dtype: AllReduceDtype,
    timeout: Duration,
    group: Arc<GroupState>,
}

/// Element types the collectives move.
fn nccl_type(dtype: DType) -> Result<sys::ncclDataType_t> {
    match dtype {
        DType::F32 => Ok(sys::ncclDataType_t::ncclFloat32),
        DType::BF16 => Ok(sys::ncclDataType_t::ncclBfloat16),
        DType::F16 => Ok(sys::ncclDataType_t::ncclFloat16),
        DType::U32 => Ok(sys::ncclDataType_t::ncclUint32),
        other => Err(EngineError::CommAborted(format!(
            "NCCL collectives do not take {other:?} tensors here"
        ))),
    }
}

impl NcclComm {
    /// The live communicator, or why the group was aborted.
    fn handle(&self) -> Result<sys::ncclComm_t> {
        if let Some(reason) = self.group.reason() {
            self.comm.borrow_mut().take();
            return Err(EngineError::CommAborted(reason));
        }
        self.comm
            .borrow()
            .as_ref()
            .map(|c| c.0)
            .ok_or_else(|| EngineError::CommAborted("the NCCL communicator was aborted".into()))
    }

    /// Queues `op(send, recv, count, type, comm, stream)` on `x` (made contiguous) into a
    /// new buffer of `out_len` elements; returns it as a tensor of `out_shape`.
    fn run(
        &self,
        x: &Tensor,
        out_len: usize,
        out_shape: Vec<usize>,
        what: &str,
        op: impl FnOnce(
            *const c_void,
            *mut c_void,
            usize,
            sys::ncclDataType_t,
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> Result<()>,
    ) -> Result<Tensor> {
        let comm = self.handle()?;
        let x = x.contiguous()?;
        let ty = nccl_type(x.dtype())?;
        let count = x.elem_count();
        if out_shape.iter().product::<usize>() != out_len {
            return Err(nccl_err(
                what,
                format!("{out_len} elements for {out_shape:?}"),
            ));
        }
        // NCCL writes every element of the output.
        let out = Gpu::of(x.device())?.output(x.dtype(), out_shape)?;
        let (xh, oh) = (
            Held::new(&x, "NCCL input")?,
            Held::new(&out, "NCCL output")?,
        );
        let (send, recv) = (xh.address()?, oh.address()?);
        self.pass_gate()?;
        let queued = op(
            send as *const c_void,
            recv as *mut c_void,
            count,
            ty,
            comm,
            self.stream.cu_stream() as _,
        );
        if let Err(e) = &queued {
            self.abort(&e.to_string());
        }
        queued?;
        self.pass_gate()?;
        drop((xh, oh));
        Ok(out)
    }

    /// For ranks sharing one GPU, waits until every rank of the group in this process
    /// is here (see the module's notes); aborts the group when one never comes.
    fn pass_gate(&self) -> Result<()> {
        let Some(gate) = &self.group.gate else {
            return Ok(());
        };
        gate.wait(self.rank)
            .inspect_err(|e| self.abort(&e.to_string()))
    }

    /// Every rank's `x` (all of one size) one after another along a new leading extent:
    /// a tensor of `out_shape`.
    fn gather_equal(&self, x: &Tensor, out_shape: Vec<usize>) -> Result<Tensor> {
        let len = x.elem_count() * self.world;
        self.run(
            x,
            len,
            out_shape,
            "all-gather",
            |s, r, n, ty, comm, stream| {
                // SAFETY: `n` elements sent and `n * world` received, of type `ty`, on this
                // rank's device and stream.
                unsafe { result::all_gather(s, r, n, ty, comm, stream) }
                    .map(|_| ())
                    .map_err(|e| nccl_err("all-gather", e))
            },
        )
    }

    /// Waits for the queued work; aborts this rank's communicator when that fails.
    fn wait(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let comm = self.handle()?;
        let group = self.group.clone();
        let outcome = wait_for_stream(&self.stream, deadline, || {
            if let Some(reason) = group.reason() {
                return Some(reason);
            }
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: `comm` is live (this rank has not aborted it) and `state` is a
            // valid out-pointer.
            let _ = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
            match state {
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => None,
                other => Some(format!("NCCL reported {other:?}")),
            }
        });
        let reason = match outcome {
            Ok(()) => return Ok(()),
            Err(WaitEnd::TimedOut) => format!(
                "rank {}: collectives did not finish within {:?}",
                self.rank, self.timeout
            ),
            Err(WaitEnd::Interrupted(r) | WaitEnd::Failed(r)) => r,
        };
        self.abort(&reason);
        Err(EngineError::CommAborted(reason))
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&mut self, x: &Tensor) -> Result<Tensor> {
        let wire = match self.dtype {
            AllReduceDtype::F32 => DType::F32,
            AllReduceDtype::Bf16 => DType::BF16,
        };
        let send = x.to_dtype(wire)?;
        let sum = self.run(
            &send,
            send.elem_count(),
            x.dims().to_vec(),
            "all-reduce",
            |s, r, n, ty, comm, stream| {
                // SAFETY: send and receive buffers hold `n` elements of `ty` on this rank's
                // device; the collective is queued on the rank's stream.
                unsafe { result::all_reduce(s, r, n, ty, sys::ncclRedOp_t::ncclSum, comm, stream) }
                    .map(|_| ())
                    .map_err(|e| nccl_err("all-reduce", e))
            },
        )?;
        Ok(sum.to_dtype(x.dtype())?)
    }

    fn all_gather(&mut self, x: &Tensor, dim: usize) -> Result<Tensor> {
        let world = self.world;
        // NCCL gathers equal-sized buffers: share every rank's length along `dim`, pad
        // to the longest, gather along a leading axis, then cut the padding off.
        let mine = Tensor::from_vec(vec![x.dim(dim)? as u32], 1, &Device::Cuda(self.dev.clone()))?;
        let lens = self.gather_equal(&mine, vec![world])?;
        self.wait()?;
        let lens: Vec<usize> = lens
            .to_vec1::<u32>()?
            .into_iter()
            .map(|l| l as usize)
            .collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        let here = x.dim(dim)?;
        let padded = if here < longest {
            x.pad_with_zeros(dim, 0, longest - here)?
        } else {
            x.clone()
        };
        let moved = padded.transpose(0, dim)?.contiguous()?;
        let mut shape = moved.dims().to_vec();
        shape[0] = longest * world;
        let all = self.gather_equal(&moved, shape)?;
        let parts = lens
            .iter()
            .enumerate()
            .map(|(r, len)| all.narrow(0, r * longest, *len))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Tensor::cat(&parts, 0)?.transpose(0, dim)?.contiguous()?)
    }

    fn broadcast(&mut self, x: &Tensor, root: usize) -> Result<Tensor> {
        let root = i32::try_from(root).map_err(|e| nccl_err("root", e))?;
        self.run(
            x,
            x.elem_count(),
            x.dims().to_vec(),
            "broadcast",
            |s, r, n, ty, comm, stream| {
                // SAFETY: `n` elements each way on this rank's stream.
                unsafe { result::broadcast(s, r, n, ty, root, comm, stream) }
                    .map(|_| ())
                    .map_err(|e| nccl_err("broadcast", e))
            },
        )
    }

    fn barrier(&mut self) -> Result<()> {
        let one = Tensor::zeros(1, DType::F32, &Device::Cuda(self.dev.clone()))?;
        self.all_reduce_sum(&one)?;
        self.wait()
    }

    fn abort(&self, reason: &str) {
        tracing::error!("rank {}: aborting the NCCL group: {reason}", self.rank);
        self.group.abort(reason);
        // Dropping the communicator calls ncclCommAbort.
        self.comm.borrow_mut().take();
    }

    fn settle(&mut self) -> Result<()> {
        self.wait()
    }
}
