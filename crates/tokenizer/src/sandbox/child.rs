//! The sandbox process: started by a server with its standard input and output as pipes,
//! it limits its own memory, compiles the template it is sent, then renders one context
//! per request until its input closes. A render that passes the memory limit aborts this
//! process (Rust aborts when an allocation fails); its server sees the pipe close, fails
//! that one request and starts another sandbox.

use std::io::{BufReader, BufWriter};

use serde_json::Map;

use super::frame::{read_frame, write_frame, FrameError};
use super::{Reply, SandboxInit};
use crate::chat_template::ChatTemplate;

/// Runs a sandbox on this process's standard input and output. Returns the process exit
/// code: 0 when the server closed the input, 1 when the exchange broke.
pub fn serve_stdio() -> i32 {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut input = BufReader::new(stdin.lock());
    let mut output = BufWriter::new(stdout.lock());
    match serve(&mut input, &mut output) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("chat template sandbox: {e:?}");
            1
        }
    }
}

fn serve(
    input: &mut impl std::io::Read,
    output: &mut impl std::io::Write,
) -> Result<(), FrameError> {
    let Some(init) = read_frame::<SandboxInit>(input)? else {
        return Ok(());
    };
    if let Err(e) = limit_memory(init.memory_limit_bytes) {
        return write_frame(output, &Reply::Failed(e));
    }
    let template = match ChatTemplate::new(&init.source, init.special_tokens, &init.config) {
        Ok(template) => template,
        Err(e) => return write_frame(output, &Reply::Failed(e.to_string())),
    };
    write_frame(output, &Reply::Ready)?;
    while let Some(ctx) = read_frame::<Map<String, serde_json::Value>>(input)? {
        let reply = match template.render_context(&ctx) {
            Ok(text) => Reply::Rendered(text),
            Err(e) => Reply::Failed(e.to_string()),
        };
        write_frame(output, &reply)?;
    }
    Ok(())
}

/// Caps this process's data segment and private writable mappings, which hold every heap
/// allocation, at `bytes` in all (a fresh process uses a few MiB of it), or at the hard
/// limit the process was started with when that is lower (a container's `ulimit -d`).
fn limit_memory(bytes: u64) -> Result<(), String> {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `current` is a valid rlimit the call writes into.
    if unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut current) } != 0 {
        return Err(format!(
            "cannot read the sandbox's memory limit: {}",
            std::io::Error::last_os_error()
        ));
    }
    let wanted = (bytes as libc::rlim_t).min(current.rlim_max);
    let limit = libc::rlimit {
        rlim_cur: wanted,
        rlim_max: wanted,
    };
    // SAFETY: `limit` is a valid rlimit that outlives the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) } != 0 {
        return Err(format!(
            "cannot limit the sandbox's memory: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
