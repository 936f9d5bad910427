//! One line per check for `docs/gpu-verification.md`, and the random data checks use.

use candle_core::{DType, Device, Tensor};

/// Prints the check's line and fails it when `ok` is false.
pub fn check(name: &str, figure: String, bound: String, ok: bool) {
    println!("GPU-CHECK | {name} | {figure} | {bound}");
    assert!(ok, "{name}: {figure} is outside {bound}");
}

/// The first CUDA device, opened as the engine opens it.
pub fn gpu() -> Device {
    tessera_engine::DeviceSpec::Cuda(0)
        .open()
        .expect("a CUDA device")
}

/// A small deterministic generator (the checks need no statistical quality).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        self.next_u32() as f32 / (1u64 << 31) as f32 - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.next_u32() as usize % n.max(1)
    }

    pub fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

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

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
