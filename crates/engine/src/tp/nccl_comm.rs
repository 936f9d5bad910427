//! `NcclComm`: collectives between GPUs over NCCL (`cudarc::nccl`), feature `cuda`.
//!
//! One communicator per worker thread, created on that thread from a unique id shared by
//! the group ([`NcclEndpoint`]). Within one node the id is handed out in process
//! ([`NcclEndpoint::group`]); across nodes the same 128-byte id would travel over a TCP
//! rendezvous, which [`NcclEndpoint::from_id`] is the entry point for.
//!
//! Tensors reach the collectives through device buffers on the rank's stream. While the
//! model runs on CPU tensors (the CUDA paged-attention kernel is not built yet), data is
//! staged host → device → host around each collective; with CUDA tensors the staging
//! disappears and the same NCCL calls apply.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::safe::{Comm, Id, NcclType, ReduceOp};

use crate::error::{EngineError, Result};
use crate::tp::comm::{AllReduceDtype, Communicator, Endpoint};

fn nccl_err(what: &str, e: impl std::fmt::Debug) -> EngineError {
    EngineError::CommAborted(format!("NCCL {what}: {e:?}"))
}

/// True when the CUDA driver and NCCL libraries can be loaded (cudarc panics otherwise).
pub fn nccl_available() -> bool {
    // SAFETY: these only try to dlopen the libraries and report whether they loaded.
    unsafe { cudarc::driver::sys::is_culib_present() && cudarc::nccl::sys::is_culib_present() }
}

/// What a worker needs to join an NCCL group: sendable, connected on the worker thread.
#[derive(Debug, Clone, Copy)]
pub struct NcclEndpoint {
    id: Id,
    rank: usize,
    world: usize,
    ordinal: usize,
    dtype: AllReduceDtype,
}

impl NcclEndpoint {
    /// Endpoints for GPUs `ordinals[rank]` of one node, sharing a fresh unique id.
    pub fn group(ordinals: &[usize], dtype: AllReduceDtype) -> Result<Vec<NcclEndpoint>> {
        if !nccl_available() {
            return Err(EngineError::Parallel(
                "CUDA ranks need the CUDA driver and NCCL libraries (libcuda, libnccl), which cannot be loaded here".into(),
            ));
        }
        let id = Id::new().map_err(|e| nccl_err("unique id", e))?;
        Ok(ordinals
            .iter()
            .enumerate()
            .map(|(rank, &ordinal)| Self::from_id(id, rank, ordinals.len(), ordinal, dtype))
            .collect())
    }

    /// An endpoint from an id obtained elsewhere (for example over a TCP rendezvous).
    pub fn from_id(
        id: Id,
        rank: usize,
        world: usize,
        ordinal: usize,
        dtype: AllReduceDtype,
    ) -> Self {
        Self {
            id,
            rank,
            world,
            ordinal,
            dtype,
        }
    }
}

impl Endpoint for NcclEndpoint {
    fn connect(self: Box<Self>) -> Result<Box<dyn Communicator>> {
        let ctx = CudaContext::new(self.ordinal).map_err(|e| nccl_err("context", e))?;
        let stream = ctx.default_stream();
        let comm = Comm::from_rank(stream.clone(), self.rank, self.world, self.id)
            .map_err(|e| nccl_err("init", e))?;
        Ok(Box::new(NcclComm {
            comm,
            stream,
            rank: self.rank,
            world: self.world,
            dtype: self.dtype,
            aborted: None,
        }))
    }
}

/// One GPU rank's NCCL communicator. Not `Send`: it lives and dies on its worker thread.
pub struct NcclComm {
    comm: Comm,
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
    dtype: AllReduceDtype,
    aborted: Option<String>,
}

impl NcclComm {
    fn check(&self) -> Result<()> {
        match &self.aborted {
            Some(reason) => Err(EngineError::CommAborted(reason.clone())),
            None => Ok(()),
        }
    }

    fn host(x: &Tensor) -> Result<Vec<f32>> {
        Ok(x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
    }

    fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(data)
            .map_err(|e| nccl_err("copy", e))
    }

    fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(len)
            .map_err(|e| nccl_err("alloc", e))
    }

    fn download<T: DeviceRepr>(&self, buf: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(buf).map_err(|e| nccl_err("copy", e))
    }

    /// Element-wise sum over the group, staged through device buffers.
    fn sum<T: NcclType + DeviceRepr + ValidAsZeroBits>(&self, data: &[T]) -> Result<Vec<T>> {
        let send = self.upload(data)?;
        let mut recv = self.zeros::<T>(data.len())?;
        self.comm
            .all_reduce(&send, &mut recv, &ReduceOp::Sum)
            .map_err(|e| nccl_err("all-reduce", e))?;
        self.download(&recv)
    }

    fn sum_f32(&self, data: &[f32]) -> Result<Vec<f32>> {
        self.sum(data)
    }

    fn sum_bf16(&self, data: &[f32]) -> Result<Vec<f32>> {
        let half: Vec<half::bf16> = data.iter().map(|v| half::bf16::from_f32(*v)).collect();
        Ok(self.sum(&half)?.into_iter().map(|v| v.to_f32()).collect())
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
        self.check()?;
        let data = Self::host(x)?;
        let sum = match self.dtype {
            AllReduceDtype::F32 => self.sum_f32(&data)?,
            AllReduceDtype::Bf16 => self.sum_bf16(&data)?,
        };
        Ok(Tensor::from_vec(sum, x.shape(), &Device::Cpu)?.to_dtype(x.dtype())?)
    }

    fn all_gather(&mut self, x: &Tensor, dim: usize) -> Result<Tensor> {
        self.check()?;
        // NCCL gathers equal-sized buffers: share every rank's length along `dim`, pad to
        // the longest, gather, then cut the padding off.
        let mut lens = vec![0f32; self.world];
        lens[self.rank] = x.dim(dim)? as f32;
        let lens: Vec<usize> = self
            .sum_f32(&lens)?
            .into_iter()
            .map(|v| v as usize)
            .collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        let mine = x.to_dtype(DType::F32)?;
        let padded = if mine.dim(dim)? < longest {
            mine.pad_with_zeros(dim, 0, longest - mine.dim(dim)?)?
        } else {
            mine
        };
        let moved = padded.transpose(0, dim)?.contiguous()?;
        let data = Self::host(&moved)?;
        let send = self.upload(&data)?;
        let mut recv = self.zeros::<f32>(data.len() * self.world)?;
        self.comm
            .all_gather(&send, &mut recv)
            .map_err(|e| nccl_err("all-gather", e))?;
        let all = self.download(&recv)?;
        let mut shape = moved.dims().to_vec();
        let mut parts = Vec::with_capacity(self.world);
        for (r, chunk) in all
            .chunks_exact(data.len().max(1))
            .enumerate()
            .take(self.world)
        {
            shape[0] = longest;
            let t = Tensor::from_vec(chunk.to_vec(), shape.clone(), &Device::Cpu)?;
            parts.push(t.narrow(0, 0, lens[r])?);
        }
        Ok(Tensor::cat(&parts, 0)?
            .transpose(0, dim)?
            .contiguous()?
            .to_dtype(x.dtype())?)
    }

    fn broadcast(&mut self, x: &Tensor, root: usize) -> Result<Tensor> {
        self.check()?;
        let data = Self::host(x)?;
        let send = self.upload(&data)?;
        let mut recv = self.zeros::<f32>(data.len())?;
        let root_i32 = i32::try_from(root).map_err(|e| nccl_err("root", e))?;
        self.comm
            .broadcast(Some(&send), &mut recv, root_i32)
            .map_err(|e| nccl_err("broadcast", e))?;
        let out = self.download(&recv)?;
        Ok(Tensor::from_vec(out, x.shape(), &Device::Cpu)?.to_dtype(x.dtype())?)
    }

    fn barrier(&mut self) -> Result<()> {
        self.check()?;
        self.sum_f32(&[0.0]).map(|_| ())
    }

    fn abort(&self, reason: &str) {
        // The NCCL communicator is aborted when it is dropped with the failed worker;
        // peers already inside a collective are released by the engine's step timeout.
        tracing::error!("rank {}: NCCL group aborted: {reason}", self.rank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a GPU driver, asking for CUDA ranks is an error that says what is missing,
    /// never cudarc's panic.
    #[test]
    fn missing_driver_is_a_clean_error() {
        if nccl_available() {
            return;
        }
        let err = NcclEndpoint::group(&[0, 1], AllReduceDtype::F32)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("libnccl"), "{err}");
    }
}
