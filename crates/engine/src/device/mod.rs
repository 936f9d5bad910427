//! Devices and what lives on them: device names as users write them, the element types a
//! rank computes in, layer maps for pipeline stages, GPU and host memory sizing, and the buffers
//! our kernels are launched on. Below the loader and the model, which place tensors here.

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
pub mod buffers;
pub mod device_spec;
pub mod dtype;
pub mod gpu_memory;
pub mod host_memory;
pub mod layer_map;

pub use device_spec::DeviceSpec;
pub use layer_map::{LayerMap, LayerMapEntry, Stage};
