//! Template sandboxes: chat templates come with model files, and minijinja cannot bound
//! the memory a template allocates (a string doubled in a loop reaches gigabytes in a few
//! dozen instructions). Renders therefore run in separate processes, each with a memory
//! limit (`RLIMIT_DATA`) and each render under a deadline. A template that passes either
//! fails its one request with a clear message; the server and its other requests carry on,
//! and the next render starts a fresh sandbox.
//!
//! A server gives a [`SandboxLauncher`] (its own executable with an argument that makes it
//! call [`serve_stdio`]) to [`crate::ChatTemplate::isolate`]. Up to `max_sandboxes`
//! processes render at once; an idle one is reused, so a render costs one round trip over
//! a pipe. A sandbox exits when its server closes the pipe, including when the server dies.

mod child;
mod frame;
mod pool;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use child::serve_stdio;
pub use pool::TemplateSandbox;

use crate::template_settings::{ChatTemplateConfig, SpecialTokenStrings};

/// How to start a sandbox process and the limits it runs under.
#[derive(Debug, Clone)]
pub struct SandboxLauncher {
    /// The executable; it must call [`serve_stdio`] when given `args`.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Memory one sandbox may hold (data segment and private mappings).
    pub memory_limit_bytes: u64,
    /// Longest one render may take before its sandbox is killed.
    pub render_timeout: Duration,
    /// Most sandboxes alive at once; renders beyond that wait for one.
    pub max_sandboxes: usize,
}

impl SandboxLauncher {
    /// Default limits: 512 MiB per sandbox (a request body is 4 MiB by default and the
    /// rendered text at most 32 MiB), 10 s per render, up to 4 sandboxes.
    pub fn new(program: PathBuf, args: Vec<OsString>) -> Self {
        SandboxLauncher {
            program,
            args,
            memory_limit_bytes: 512 << 20,
            render_timeout: Duration::from_secs(10),
            max_sandboxes: 4,
        }
    }
}

/// The first message to a sandbox: what to compile and the limit to set on itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SandboxInit {
    pub source: String,
    pub special_tokens: SpecialTokenStrings,
    pub config: ChatTemplateConfig,
    pub memory_limit_bytes: u64,
}

/// A sandbox's answer: ready after compiling, then one reply per render.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Reply {
    Ready,
    Rendered(String),
    Failed(String),
}
