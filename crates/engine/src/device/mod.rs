//! Devices and what lives on them: device names as users write them, the element types a
//! rank computes in, layer maps for pipeline stages (written, or fitted to memory), GPU and host memory sizing, and the buffers
//! our kernels are launched on. Below the loader and the model, which place tensors here.

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
pub mod buffers;
pub mod device_spec;
pub mod dtype;
pub mod fit;
pub mod gpu_memory;
pub mod host_memory;
pub mod layer_map;
pub mod memory_caps;

pub use device_spec::DeviceSpec;
pub use layer_map::{DeviceLayers, LayerMap, LayerMapEntry, Stage};
pub use memory_caps::DeviceMemory;
