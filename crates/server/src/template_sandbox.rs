//! The `tessera` binary is its own chat template sandbox: started with [`SANDBOX_ARG`] as
//! its first argument it renders templates on its standard input and output (see
//! `tessera_tokenizer::sandbox`) instead of parsing a command line.

use std::ffi::OsString;
use std::path::PathBuf;

use tessera_tokenizer::sandbox::SandboxLauncher;

/// The first argument that turns the binary into a template sandbox. Not a subcommand:
/// nobody types it, and `--help` does not list it.
pub const SANDBOX_ARG: &str = "__chat-template-sandbox";

/// Whether this process was started as a sandbox.
pub fn is_sandbox_invocation(args: &[OsString]) -> bool {
    args.get(1).is_some_and(|a| a == SANDBOX_ARG)
}

/// Runs this process as a sandbox; the process exit code.
pub fn run_sandbox() -> u8 {
    u8::try_from(tessera_tokenizer::sandbox::serve_stdio()).unwrap_or(1)
}

/// Starts sandboxes from this very executable: `/proc/self/exe` still names it when the
/// file on disk was replaced or removed since start-up.
pub fn launcher() -> SandboxLauncher {
    let proc_exe = PathBuf::from("/proc/self/exe");
    let program = if proc_exe.exists() {
        proc_exe
    } else {
        std::env::current_exe().unwrap_or(proc_exe)
    };
    SandboxLauncher::new(program, vec![OsString::from(SANDBOX_ARG)])
}
