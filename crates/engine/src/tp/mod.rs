//! Tensor parallelism: split states, the shard plan, communicators.

pub(crate) mod barrier;
pub mod comm;
#[cfg(feature = "cuda")]
pub mod device_comm;
#[cfg(feature = "cuda")]
pub(crate) mod gpu_wait;
pub mod local_comm;
#[cfg(feature = "cuda")]
pub mod nccl_comm;
pub mod nccl_version;
pub mod plan;
pub mod split;
pub mod tcp_comm;
pub(crate) mod wire;

pub use comm::{AllReduceDtype, Communicator, Endpoint, SameGpuComm};
#[cfg(feature = "cuda")]
pub use device_comm::DeviceComm;
pub use local_comm::LocalComm;
#[cfg(feature = "cuda")]
pub use nccl_comm::NcclEndpoint;
pub use plan::{PlanOptions, RankShard, ShardPlan};
pub use split::{Segment, SplitState};
pub use tcp_comm::{GroupToken, TcpComm, TcpEndpoint};
