//! One line per check for `docs/gpu-verification.md`, and the random data checks use.

use candle_core::{DType, Device, Tensor};

/// Prints the check's line and fails it when `ok` is false.
pub fn check(name: &str, figure: String, bound: String, ok: bool) {
    println!("GPU-CHECK | {name} | {figure} | {bound}");
    if !ok {
        println!("GPU-CHECK-FAILED | {name}");
    }
    assert!(ok, "{name}: {figure} is outside {bound}");
}

/// The first CUDA device, opened as the engine opens it.
pub fn gpu() -> Device {
    tessera_engine::DeviceSpec::Cuda(0)
        .open()
        .expect("a CUDA device")
}

pub use tessera_kernels::gpu::reference::{max_abs_diff, Lcg};

/// `values` rounded to `dtype` and back, as the device will see them.
pub fn rounded(values: &[f32], dtype: DType) -> Vec<f32> {
    Tensor::from_slice(values, values.len(), &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .and_then(|t| t.to_dtype(DType::F32))
        .and_then(|t| t.to_vec1::<f32>())
        .expect("rounding on CPU")
}

/// `values` as a `dtype` tensor of `shape` on `device`.
pub fn upload(values: &[f32], shape: &[usize], dtype: DType, device: &Device) -> Tensor {
    Tensor::from_slice(values, shape, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .and_then(|t| t.to_device(device))
        .expect("upload")
}

/// A device tensor's values as f32 on the host.
pub fn download(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .expect("download")
}
