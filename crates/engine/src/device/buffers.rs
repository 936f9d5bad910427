//! The buffers behind a GPU-path rank's tensors, for launching kernels of our own on
//! them: their addresses, new tensors for kernels to fill, and the launch itself.
//!
//! A CUDA rank launches on its device's stream. In test builds (feature `gpu-emulation`)
//! a host rank can take the same path: its tensors live in host memory and the kernels
//! run emulated (`tessera_kernels_emulated`), from the same argument lists.
//!
//! A [`Held`] keeps the tensor's storage read-locked while its address is in use. Kernels
//! that write a buffer (the KV cache, the queries RoPE rotates) receive it through such a
//! shared lock too: on CUDA the writes are ordered by the rank's stream, on which every
//! use of the tensor is queued; emulated launches run on the calling thread before it
//! returns. Either way no Rust code reads the buffer meanwhile.

use candle_core::{DType, Device, Shape, StorageRef, Tensor};
use tessera_kernels::gpu::launch::{KernelArg, LaunchShape};

use crate::error::{EngineError, Result};

fn not_gpu(what: &str) -> EngineError {
    EngineError::Step(format!(
        "{what}: expected a tensor of a GPU rank (a CUDA device)"
    ))
}

/// The CUDA device of `device`.
#[cfg(feature = "cuda")]
pub(crate) fn cuda_device(device: &Device) -> Result<&candle_core::CudaDevice> {
    match device {
        Device::Cuda(d) => Ok(d),
        _ => Err(not_gpu("device")),
    }
}

/// A PTX module of ours, named once per device.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Module {
    Attention,
    KvWrite,
    Activations,
    Norm,
    Argmax,
    Candidates,
    QuantMatvec,
    Moe,
}

#[cfg(feature = "cuda")]
impl Module {
    fn source(self) -> (&'static str, &'static str) {
        use tessera_kernels::gpu::ptx;
        match self {
            Module::Attention => ("tessera_attention", ptx::ATTENTION),
            Module::KvWrite => ("tessera_kv_write", ptx::KV_WRITE),
            Module::Activations => ("tessera_activations", ptx::ACTIVATIONS),
            Module::Norm => ("tessera_norm", ptx::NORM),
            Module::Argmax => ("tessera_argmax", ptx::ARGMAX),
            Module::Candidates => ("tessera_candidates", ptx::CANDIDATES),
            Module::QuantMatvec => ("tessera_quant_matvec", ptx::QUANT_MATVEC),
            Module::Moe => ("tessera_moe", ptx::MOE),
        }
    }
}

/// The device a GPU-path rank launches on.
#[derive(Debug, Clone, Copy)]
pub struct Gpu<'a> {
    device: &'a Device,
}

impl<'a> Gpu<'a> {
    /// The GPU of `device`; an error for a device that takes no GPU path.
    pub fn of(device: &'a Device) -> Result<Self> {
        match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => Ok(Self { device }),
            #[cfg(feature = "gpu-emulation")]
            Device::Cpu => Ok(Self { device }),
            _ => Err(not_gpu("device")),
        }
    }

    pub(crate) fn device(&self) -> &'a Device {
        self.device
    }

    /// A contiguous tensor of `shape` for a kernel to fill: on CUDA left uninitialised
    /// (every kernel that returns one writes all of it), on the host zeroed.
    pub(crate) fn output(&self, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        match self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => cuda_output(dev, dtype, shape),
            device => Ok(Tensor::zeros(shape, dtype, device)?),
        }
    }

    /// Launches kernel `name` of `module` on `shape` with `args`.
    ///
    /// # Safety
    ///
    /// `args` must match the kernel's signature, and every index the kernel forms from
    /// them must stay inside the buffers they address.
    pub(crate) unsafe fn launch(
        &self,
        module: Module,
        name: &str,
        shape: LaunchShape,
        args: &[KernelArg],
    ) -> Result<()> {
        match self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => {
                use candle_core::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
                let (module_name, ptx) = module.source();
                let f = dev
                    .get_or_load_custom_func(name, module_name, ptx)
                    .map_err(|e| launch_err(name, e))?;
                let mut b = f.builder();
                for a in args {
                    match a {
                        KernelArg::Ptr(v) => b.arg(v),
                        KernelArg::I32(v) => b.arg(v),
                        KernelArg::F32(v) => b.arg(v),
                        KernelArg::Usize(v) => b.arg(v),
                    };
                }
                let cfg = LaunchConfig {
                    grid_dim: shape.grid,
                    block_dim: (shape.block, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: the caller's promise; the addresses are device pointers of this
                // device (event tracking is off, so raw pointers need no guards).
                unsafe { b.launch(cfg) }.map_err(|e| launch_err(name, e))?;
                Ok(())
            }
            #[cfg(feature = "gpu-emulation")]
            Device::Cpu => {
                let _ = module;
                // SAFETY: the caller's promise; the addresses are host buffers held by
                // the caller for the call, which runs the whole grid before returning.
                unsafe { tessera_kernels_emulated::launch(name, shape, args) }
                    .map_err(|e| launch_err(name, e))
            }
            _ => Err(not_gpu(name)),
        }
    }
}

impl Gpu<'_> {
    /// Writes `values` over the first elements of the contiguous u32 tensor `dst`, in
    /// place: on CUDA a copy queued on the rank's stream (after every kernel queued before
    /// it, before every kernel queued after), on the host at once. The buffers a replayed
    /// CUDA graph reads are filled this way.
    pub(crate) fn write_u32(&self, dst: &Tensor, values: &[u32]) -> Result<()> {
        expect_dtype(dst, DType::U32, "static buffer")?;
        let held = Held::new(dst, "static buffer")?;
        // Checks the range before any address is formed.
        held.arg_range(0..values.len())?;
        if values.is_empty() {
            return Ok(());
        }
        match self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => {
                use candle_core::cuda::cudarc::driver::result;
                let stream = dev.cuda_stream();
                stream
                    .context()
                    .bind_to_thread()
                    .map_err(|e| launch_err("copy to a static buffer", e))?;
                // SAFETY: the range was checked against the tensor above; a copy from
                // pageable memory has read `values` before it returns.
                unsafe { result::memcpy_htod_async(held.address()?, values, stream.cu_stream()) }
                    .map_err(|e| launch_err("copy to a static buffer", e))
            }
            #[cfg(feature = "gpu-emulation")]
            Device::Cpu => {
                let KernelArg::Ptr(at) = held.arg()? else {
                    return Err(not_gpu("static buffer"));
                };
                // SAFETY: the range was checked against the tensor above; as for the
                // emulated kernels' writes, no Rust code reads the buffer meanwhile.
                unsafe {
                    std::ptr::copy_nonoverlapping(values.as_ptr(), at as *mut u32, values.len())
                };
                Ok(())
            }
            _ => Err(not_gpu("static buffer")),
        }
    }
}

pub(crate) fn launch_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Step(format!("CUDA kernel {what}: {e}"))
}

#[cfg(feature = "cuda")]
fn cuda_output(dev: &candle_core::CudaDevice, dtype: DType, shape: Shape) -> Result<Tensor> {
    use candle_core::cuda::CudaDType;
    use candle_core::op::BackpropOp;
    use candle_core::Storage;
    fn wrap<T: CudaDType + candle_core::cuda::cudarc::driver::DeviceRepr>(
        dev: &candle_core::CudaDevice,
        shape: Shape,
    ) -> Result<Tensor> {
        // SAFETY: the tensor is handed to a kernel that writes every element before
        // anything reads it (see `Gpu::output`).
        let slice =
            unsafe { dev.alloc::<T>(shape.elem_count()) }.map_err(|e| launch_err("alloc", e))?;
        let storage = Storage::Cuda(T::wrap_cuda_slice(slice, dev.clone()));
        Ok(Tensor::from_storage(
            storage,
            shape,
            BackpropOp::none(),
            false,
        ))
    }
    match dtype {
        DType::BF16 => wrap::<half::bf16>(dev, shape),
        DType::F16 => wrap::<half::f16>(dev, shape),
        DType::F32 => wrap::<f32>(dev, shape),
        DType::U32 => wrap::<u32>(dev, shape),
        DType::I64 => wrap::<i64>(dev, shape),
        other => Err(EngineError::Step(format!(
            "no kernel writes {other:?} tensors"
        ))),
    }
}

/// A contiguous tensor's storage, read-locked, with the element range it covers.
pub(crate) struct Held<'a> {
    storage: StorageRef<'a>,
    dtype: DType,
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
            dtype: t.dtype(),
            start,
            end,
            what,
        })
    }

    /// The address of the tensor's first element, as a kernel argument.
    pub(crate) fn arg(&self) -> Result<KernelArg> {
        self.arg_range(0..self.end - self.start)
    }

    /// Elements `range` of the tensor (counted from its first element) as a kernel
    /// argument: the address of the first.
    pub(crate) fn arg_range(&self, range: std::ops::Range<usize>) -> Result<KernelArg> {
        self.address_of(range).map(KernelArg::Ptr)
    }

    /// The address of the tensor's first element.
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    pub(crate) fn address(&self) -> Result<u64> {
        self.address_of(0..self.end - self.start)
    }

    /// The address of element `range.start`, after checking that `range` lies inside
    /// the tensor.
    fn address_of(&self, range: std::ops::Range<usize>) -> Result<u64> {
        if range.end > self.end - self.start || range.start > range.end {
            return Err(EngineError::Step(format!(
                "{}: elements {range:?} outside its {}",
                self.what,
                self.end - self.start
            )));
        }
        let offset = (self.start + range.start) * self.dtype.size_in_bytes();
        Ok(self.base()? + offset as u64)
    }

    /// The address of the storage's first element.
    fn base(&self) -> Result<u64> {
        use candle_core::{CpuStorage, Storage};
        match &*self.storage {
            Storage::Cpu(s) => Ok(match s {
                CpuStorage::BF16(v) => v.as_ptr() as u64,
                CpuStorage::F16(v) => v.as_ptr() as u64,
                CpuStorage::F32(v) => v.as_ptr() as u64,
                CpuStorage::U32(v) => v.as_ptr() as u64,
                CpuStorage::I64(v) => v.as_ptr() as u64,
                CpuStorage::U8(v) => v.as_ptr() as u64,
                _ => return Err(not_gpu(self.what)),
            }),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => {
                use candle_core::cuda::cudarc::driver::DevicePtr;
                let wrong =
                    |e: candle_core::Error| EngineError::Step(format!("{}: {e}", self.what));
                macro_rules! ptr {
                    ($t:ty) => {{
                        let slice = s.as_cuda_slice::<$t>().map_err(wrong)?;
                        let (p, _sync) = slice.device_ptr(slice.stream());
                        p
                    }};
                }
                Ok(match self.dtype {
                    DType::BF16 => ptr!(half::bf16),
                    DType::F16 => ptr!(half::f16),
                    DType::F32 => ptr!(f32),
                    DType::U32 => ptr!(u32),
                    DType::I64 => ptr!(i64),
                    DType::U8 => ptr!(u8),
                    _ => return Err(not_gpu(self.what)),
                })
            }
            _ => Err(not_gpu(self.what)),
        }
    }
}

/// An element type whose leading elements [`prefix_to_host`] copies.
#[cfg(feature = "cuda")]
pub(crate) trait HostCopy:
    candle_core::WithDType
    + candle_core::cuda::CudaDType
    + candle_core::cuda::cudarc::driver::DeviceRepr
{
}
/// An element type whose leading elements [`prefix_to_host`] copies.
#[cfg(not(feature = "cuda"))]
pub(crate) trait HostCopy: candle_core::WithDType {}
impl HostCopy for u32 {}
impl HostCopy for f32 {}

/// The first `n` elements of a contiguous tensor on the host. On a GPU only those cross
/// to the host: candle's `to_vec1` of a narrowed tensor copies its whole buffer first.
pub(crate) fn prefix_to_host<T: HostCopy>(t: &Tensor, n: usize) -> Result<Vec<T>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(_) = t.device() {
        let (storage, layout) = t.storage_and_layout();
        let (start, _) = layout
            .contiguous_offsets()
            .filter(|(s, e)| n <= e - s)
            .ok_or_else(|| {
                EngineError::Step(format!(
                    "copy of {n} elements from a tensor of {} that is not contiguous or shorter",
                    t.elem_count()
                ))
            })?;
        let candle_core::Storage::Cuda(s) = &*storage else {
            return Err(not_gpu("prefix copy"));
        };
        let slice = s.as_cuda_slice::<T>()?;
        return slice
            .stream()
            .clone_dtoh(&slice.slice(start..start + n))
            .map_err(|e| launch_err("copy to the host", e));
    }
    Ok(t.narrow(0, 0, n)?.to_vec1::<T>()?)
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
