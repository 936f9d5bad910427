//! [`TemplateSandbox`]: the sandbox processes of one chat template, started on demand, reused
//! while they behave and replaced when one dies or overruns its deadline.

use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Map;

use super::frame::{read_frame_by, write_frame, FrameError};
use super::{Reply, SandboxInit, SandboxLauncher};
use crate::error::{Result, TokenizerError};

/// The sandboxes of one template.
pub struct TemplateSandbox {
    launcher: SandboxLauncher,
    init: SandboxInit,
    slots: Mutex<Slots>,
    freed: Condvar,
}

/// Idle sandboxes, and how many exist (idle or rendering).
struct Slots {
    idle: Vec<Sandbox>,
    live: usize,
}

impl std::fmt::Debug for TemplateSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateSandbox")
            .field("launcher", &self.launcher)
            .finish_non_exhaustive()
    }
}

impl TemplateSandbox {
    /// Starts the first sandbox, so that a broken launcher or a template the sandbox
    /// cannot compile is reported now.
    pub(crate) fn start(launcher: SandboxLauncher, init: SandboxInit) -> Result<Self> {
        let first = Sandbox::spawn(&launcher, &init)?;
        Ok(TemplateSandbox {
            launcher,
            init,
            slots: Mutex::new(Slots {
                idle: vec![first],
                live: 1,
            }),
            freed: Condvar::new(),
        })
    }

    /// Renders `ctx` in a sandbox. A render that the template itself fails, or that kills
    /// its sandbox (memory) or overruns the deadline, is a `Template` error for this
    /// request only.
    pub(crate) fn render(&self, ctx: &Map<String, serde_json::Value>) -> Result<String> {
        let mut sandbox = self.take()?;
        let deadline = Instant::now() + self.launcher.render_timeout;
        let exchanged = write_frame(&mut sandbox.stdin, ctx)
            .and_then(|()| read_frame_by::<Reply, _>(&mut sandbox.stdout, deadline));
        match exchanged {
            Ok(reply) => {
                self.give_back(sandbox);
                match reply {
                    Reply::Rendered(text) => Ok(text),
                    Reply::Failed(message) => Err(TokenizerError::Template(message)),
                    Reply::Ready => Err(TokenizerError::Template(
                        "the template sandbox answered out of turn".to_string(),
                    )),
                }
            }
            Err(failure) => {
                let why = sandbox.end(&failure, &self.launcher);
                self.forget_one();
                Err(TokenizerError::Template(why))
            }
        }
    }

    /// An idle sandbox, a new one when fewer than the limit exist, else waits for one.
    fn take(&self) -> Result<Sandbox> {
        let mut slots = self.lock();
        loop {
            if let Some(sandbox) = slots.idle.pop() {
                return Ok(sandbox);
            }
            if slots.live < self.launcher.max_sandboxes.max(1) {
                slots.live += 1;
                drop(slots);
                return Sandbox::spawn(&self.launcher, &self.init).inspect_err(|_| {
                    self.forget_one();
                });
            }
            slots = self
                .freed
                .wait(slots)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn give_back(&self, sandbox: Sandbox) {
        self.lock().idle.push(sandbox);
        self.freed.notify_one();
    }

    /// A sandbox that will not come back: its slot is free for a new one.
    fn forget_one(&self) {
        let mut slots = self.lock();
        slots.live = slots.live.saturating_sub(1);
        drop(slots);
        self.freed.notify_one();
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        // The slots stay consistent whatever a panicking holder did: each change is one
        // push, pop or counter step.
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for TemplateSandbox {
    fn drop(&mut self) {
        for mut sandbox in self.lock().idle.drain(..) {
            sandbox.kill();
        }
    }
}

/// One sandbox process and its pipes.
struct Sandbox {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
}

impl Sandbox {
    /// Starts a sandbox and waits until it compiled the template.
    fn spawn(launcher: &SandboxLauncher, init: &SandboxInit) -> Result<Sandbox> {
        let mut child = Command::new(&launcher.program)
            .args(&launcher.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                TokenizerError::Sandbox(format!("cannot start {}: {e}", launcher.program.display()))
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TokenizerError::Sandbox(
                "the sandbox's pipes were not opened".to_string(),
            ));
        };
        let mut sandbox = Sandbox {
            child,
            stdin,
            stdout,
        };
        let deadline = Instant::now() + launcher.render_timeout.max(Duration::from_secs(5));
        let answer = write_frame(&mut sandbox.stdin, init)
            .and_then(|()| read_frame_by::<Reply, _>(&mut sandbox.stdout, deadline));
        match answer {
            Ok(Reply::Ready) => Ok(sandbox),
            Ok(Reply::Failed(message)) => {
                sandbox.kill();
                Err(TokenizerError::Template(message))
            }
            Ok(Reply::Rendered(_)) => {
                sandbox.kill();
                Err(TokenizerError::Sandbox(
                    "the sandbox answered out of turn".to_string(),
                ))
            }
            Err(failure) => Err(TokenizerError::Sandbox(format!(
                "{} did not start a template sandbox: {}",
                launcher.program.display(),
                sandbox.end(&failure, launcher)
            ))),
        }
    }

    /// Kills (if needed) and reaps the process; says why the exchange failed.
    fn end(mut self, failure: &FrameError, launcher: &SandboxLauncher) -> String {
        // A closed pipe means the process is ending on its own; any other failure leaves
        // it running.
        let status = match failure {
            FrameError::Closed => self.wait_briefly(),
            FrameError::TimedOut | FrameError::Broken(_) => self.kill(),
        };
        match failure {
            FrameError::TimedOut => format!(
                "rendering took longer than {:.1} s; the render was stopped",
                launcher.render_timeout.as_secs_f64()
            ),
            FrameError::Closed if died_of_abort(status) => format!(
                "rendering used more than its {} MiB memory limit; the render was stopped",
                launcher.memory_limit_bytes >> 20
            ),
            FrameError::Closed => format!(
                "the template sandbox exited during the render ({})",
                describe(status)
            ),
            FrameError::Broken(message) => format!("the template sandbox failed: {message}"),
        }
    }

    /// Waits a moment for a process whose pipe closed, then kills it.
    fn wait_briefly(&mut self) -> Option<ExitStatus> {
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => break,
            }
        }
        self.kill()
    }

    fn kill(&mut self) -> Option<ExitStatus> {
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

/// Rust aborts (SIGABRT) when an allocation fails, which under the sandbox's memory limit
/// means the render asked for more than the limit.
fn died_of_abort(status: Option<ExitStatus>) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.and_then(|s| s.signal()) == Some(libc::SIGABRT)
}

fn describe(status: Option<ExitStatus>) -> String {
    match status {
        Some(status) => status.to_string(),
        None => "status unknown".to_string(),
    }
}
