//! The device buffers behind candle's CUDA tensors, for launching kernels of our own on
//! them, and new tensors around buffers those kernels filled.
//!
//! A [`Held`] keeps the tensor's storage read-locked while its buffer is in use. Kernels
//! that write a buffer (the KV cache) receive it through such a shared lock too: the
//! writes are ordered by the rank's stream, on which every use of the tensor is queued,
//! and no host code reads the buffer meanwhile.

use candle_core::cuda::cudarc::driver::{CudaSlice, CudaView};
use candle_core::cuda::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, Shape, Storage, StorageRef, Tensor};

use crate::error::{EngineError, Result};

fn not_cuda(what: &str) -> EngineError {
    EngineError::Step(format!("{what}: expected a tensor on a CUDA device"))
}

/// The CUDA device of `device`.
pub(crate) fn cuda_device(device: &Device) -> Result<&CudaDevice> {
    match device {
        Device::Cuda(d) => Ok(d),
        _ => Err(not_cuda("device")),
    }
}

/// A contiguous CUDA tensor's storage, read-locked, with the element range it covers.
pub(crate) struct Held<'a> {
    storage: StorageRef<'a>,
    start: usize,
    end: usize,
    what: &'static str,
}

impl<'a> Held<'a> {
    pub(crate) fn new(t: &'a Tensor, what: &'static str) -> Result<Self> {
        let (storage, layout) = t.storage_and_layout();
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            EngineError::Step(format!("{what}: kernels need a contiguous tensor"))
        })?;
        Ok(Self {
            storage,
            start,
            end,
            what,
        })
    }

    fn cuda(&self) -> Result<&CudaStorage> {
        match &*self.storage {
            Storage::Cuda(s) => Ok(s),
            _ => Err(not_cuda(self.what)),
        }
    }

    /// The tensor's elements as a device view of `T` (which must be its dtype).
    pub(crate) fn view<T: CudaDType>(&self) -> Result<CudaView<'_, T>> {
        self.view_range(0..self.end - self.start)
    }

    /// Elements `range` of the tensor (counted from its first element).
    pub(crate) fn view_range<T: CudaDType>(
        &self,
        range: std::ops::Range<usize>,
    ) -> Result<CudaView<'_, T>> {
        let slice: &CudaSlice<T> = self
            .cuda()?
            .as_cuda_slice::<T>()
            .map_err(|e| EngineError::Step(format!("{}: {e}", self.what)))?;
        if range.end > self.end - self.start || range.start > range.end {
            return Err(EngineError::Step(format!(
                "{}: elements {range:?} outside its {}",
                self.what,
                self.end - self.start
            )));
        }
        Ok(slice.slice(self.start + range.start..self.start + range.end))
    }
}

/// A tensor of `shape` around a filled device buffer.
pub(crate) fn wrap<T: CudaDType>(
    slice: CudaSlice<T>,
    device: &CudaDevice,
    shape: impl Into<Shape>,
) -> Tensor {
    let storage = Storage::Cuda(T::wrap_cuda_slice(slice, device.clone()));
    Tensor::from_storage(storage, shape, BackpropOp::none(), false)
}

/// Checks a tensor's dtype before a kernel reinterprets its buffer.
pub(crate) fn expect_dtype(t: &Tensor, dtype: DType, what: &str) -> Result<()> {
    if t.dtype() == dtype {
        Ok(())
    } else {
        Err(EngineError::Step(format!(
            "{what}: expected {dtype:?}, found {:?}",
            t.dtype()
        )))
    }
}
