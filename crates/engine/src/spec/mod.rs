//! What a model IS, apart from how it runs: its hyper-parameters and features
//! ([`ModelConfig`]), its family ([`Family`]: names and tensor-name quirks), RoPE scaling,
//! mixture-of-experts settings and canonical tensor names. A leaf: it imports nothing else of the engine but its error type.

pub mod family;
pub mod model;
pub mod moe;
pub mod rope;
pub mod tensor_names;

pub use family::Family;
pub use model::{Activation, ModelConfig, RopeStyle, SlidingWindow};
pub use moe::{ClampedSwiglu, ExpertNames, ExpertTensor, MoeConfig, MoeFields, SigmoidRouter};
pub use rope::{LongRope, RopeFactorTensors, RopeScaling, Yarn};
