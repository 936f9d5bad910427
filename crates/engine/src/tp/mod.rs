//! Tensor parallelism: split states, the shard plan, communicators.

pub mod comm;
pub mod local_comm;
#[cfg(feature = "cuda")]
pub mod nccl_comm;
pub mod plan;
pub mod split;

pub use comm::{AllReduceDtype, Communicator, Endpoint};
pub use local_comm::LocalComm;
pub use plan::{PlanOptions, RankShard, ShardPlan};
pub use split::{Segment, SplitState};
