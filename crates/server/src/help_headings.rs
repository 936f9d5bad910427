//! The headings `--help` groups the options under, as llama-server groups its own. A
//! leaf: the argument structs of every subcommand name them.

pub const MODEL: &str = "Model";
pub const DEVICES: &str = "Devices and parallelism";
pub const NODES: &str = "Nodes";
pub const HTTP: &str = "HTTP";
pub const LIMITS: &str = "Limits and scheduling";
pub const LOGGING: &str = "Logging";
pub const CONFIG: &str = "Configuration";
pub const SAMPLING: &str = "Sampling";
pub const CHAT: &str = "Chat";
