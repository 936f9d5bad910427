//! Chat templates rendered in sandbox processes: the same text as in this process, and a
//! template that allocates without bound, hangs or kills its sandbox fails its own render
//! only; the next render works.
//!
//! This binary is also the sandbox: started with `sandbox` it serves renders, with
//! `silent-sandbox` it answers the start-up handshake and then never replies.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tessera_tokenizer::sandbox::{serve_stdio, SandboxLauncher};
use tessera_tokenizer::{
    ChatMessage, ChatRenderRequest, ChatTemplate, ChatTemplateConfig, SpecialTokenStrings,
    TokenizerError,
};

const CHATML: &str = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n\
{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// ChatML, except that a message saying `grow` doubles a string 34 times (16 GiB) first.
const GROWING: &str = "{% for m in messages %}{% if m.content == 'grow' %}\
{% set ns = namespace(s='x') %}{% for i in range(34) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}\
{{ ns.s | length }}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";

/// Refuses a conversation the way model templates do.
const RAISING: &str = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}\
{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("sandbox") => std::process::exit(serve_stdio()),
        Some("silent-sandbox") => silent_sandbox(),
        _ => {}
    }
    let tests: [(&str, fn()); 8] = [
        ("renders_as_in_process", renders_as_in_process),
        (
            "doubling_fails_its_render_only",
            doubling_fails_its_render_only,
        ),
        (
            "template_errors_reach_the_caller",
            template_errors_reach_the_caller,
        ),
        (
            "a_silent_sandbox_is_stopped_at_the_deadline",
            a_silent_sandbox_is_stopped_at_the_deadline,
        ),
        (
            "a_launcher_that_cannot_start_fails_at_isolate",
            a_launcher_that_cannot_start_fails_at_isolate,
        ),
        (
            "concurrent_renders_share_a_few_sandboxes",
            concurrent_renders_share_a_few_sandboxes,
        ),
        (
            "the_in_process_path_is_unchanged",
            the_in_process_path_is_unchanged,
        ),
        ("a_lower_hard_limit_is_kept", a_lower_hard_limit_is_kept),
    ];
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-')).cloned();
    let mut ran = 0;
    for (name, test) in tests {
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        eprintln!("test {name} ...");
        let start = Instant::now();
        test();
        eprintln!(
            "test {name} ... ok ({:.2} s)",
            start.elapsed().as_secs_f64()
        );
        ran += 1;
    }
    eprintln!("{ran} passed");
}

fn launcher(mode: &str) -> SandboxLauncher {
    SandboxLauncher::new(std::env::current_exe().unwrap(), vec![OsString::from(mode)])
}

fn template(source: &str) -> ChatTemplate {
    let specials = SpecialTokenStrings {
        bos_token: Some("<s>".to_string()),
        ..Default::default()
    };
    ChatTemplate::new(source, specials, &ChatTemplateConfig::default()).unwrap()
}

fn isolated(source: &str, launcher: SandboxLauncher) -> ChatTemplate {
    let mut template = template(source);
    template.isolate(launcher).unwrap();
    assert!(template.is_isolated());
    template
}

fn ask(texts: &[(&str, &str)]) -> ChatRenderRequest {
    ChatRenderRequest {
        messages: texts
            .iter()
            .map(|&(role, text)| ChatMessage::new(role, text))
            .collect(),
        add_generation_prompt: true,
        ..Default::default()
    }
}

fn renders_as_in_process() {
    let sandboxed = isolated(CHATML, launcher("sandbox"));
    let local = template(CHATML);
    let request = ask(&[("system", "Be brief."), ("user", "Hi ünïcode ✓")]);
    let expected = local.render(&request).unwrap();
    assert_eq!(
        expected,
        "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi ünïcode ✓<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(sandboxed.render(&request).unwrap(), expected);
}

fn doubling_fails_its_render_only() {
    let mut sandbox = launcher("sandbox");
    sandbox.memory_limit_bytes = 256 << 20;
    let template = isolated(GROWING, sandbox);
    let start = Instant::now();
    let err = template.render(&ask(&[("user", "grow")])).unwrap_err();
    eprintln!("{err} after {:?}", start.elapsed());
    match &err {
        TokenizerError::Template(message) => {
            assert!(message.contains("256 MiB memory limit"), "{message}");
        }
        other => panic!("expected a template error, got {other:?}"),
    }
    // The sandbox that died is replaced: the same template renders the next request.
    let text = template.render(&ask(&[("user", "hello")])).unwrap();
    assert_eq!(text, "<|im_start|>user\nhello<|im_end|>\n");
}

fn template_errors_reach_the_caller() {
    let template = isolated(RAISING, launcher("sandbox"));
    let err = template
        .render(&ask(&[("assistant", "a"), ("user", "b")]))
        .unwrap_err();
    match &err {
        TokenizerError::Template(message) => {
            assert!(message.contains("template raised: user first"), "{message}");
        }
        other => panic!("expected a template error, got {other:?}"),
    }
    assert_eq!(template.render(&ask(&[("user", "b")])).unwrap(), "b");
}

fn a_silent_sandbox_is_stopped_at_the_deadline() {
    let mut silent = launcher("silent-sandbox");
    silent.render_timeout = Duration::from_millis(300);
    let template = isolated(CHATML, silent);
    for _ in 0..2 {
        let start = Instant::now();
        let err = template.render(&ask(&[("user", "hi")])).unwrap_err();
        let elapsed = start.elapsed();
        assert!(err.to_string().contains("longer than 0.3 s"), "{err}");
        assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    }
}

fn a_launcher_that_cannot_start_fails_at_isolate() {
    let mut template = template(CHATML);
    let missing = SandboxLauncher::new(PathBuf::from("/nonexistent/tessera"), vec![]);
    let err = template.isolate(missing).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Sandbox(m) if m.contains("/nonexistent/tessera")),
        "{err:?}"
    );
    // A program that is not a sandbox: it exits without the handshake.
    let not_a_sandbox = SandboxLauncher::new(PathBuf::from("/bin/true"), vec![]);
    let err = template.isolate(not_a_sandbox).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Sandbox(m) if m.contains("did not start a template sandbox")),
        "{err:?}"
    );
    assert!(!template.is_isolated());
}

fn concurrent_renders_share_a_few_sandboxes() {
    let mut few = launcher("sandbox");
    few.max_sandboxes = 2;
    let template = std::sync::Arc::new(isolated(CHATML, few));
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let template = std::sync::Arc::clone(&template);
            std::thread::spawn(move || {
                for i in 0..20 {
                    let text = format!("thread {t} message {i}");
                    let rendered = template.render(&ask(&[("user", &text)])).unwrap();
                    assert_eq!(
                        rendered,
                        format!("<s><|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
                    );
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

fn the_in_process_path_is_unchanged() {
    let local = template(RAISING);
    assert!(!local.is_isolated());
    assert_eq!(local.render(&ask(&[("user", "x")])).unwrap(), "x");
}

/// Started under a hard data limit (a container's `ulimit -d`) below the one asked for,
/// the sandbox keeps the lower one instead of failing to start.
fn a_lower_hard_limit_is_kept() {
    let mut shell = SandboxLauncher::new(
        PathBuf::from("/bin/sh"),
        vec![
            OsString::from("-c"),
            OsString::from("ulimit -d 409600 && exec \"$0\" sandbox"),
            std::env::current_exe().unwrap().into_os_string(),
        ],
    );
    shell.memory_limit_bytes = 4 << 30;
    let template = isolated(GROWING, shell);
    let err = template.render(&ask(&[("user", "grow")])).unwrap_err();
    assert!(err.to_string().contains("memory limit"), "{err}");
    let text = template.render(&ask(&[("user", "hello")])).unwrap();
    assert_eq!(text, "<|im_start|>user\nhello<|im_end|>\n");
}

/// Answers the handshake (a frame holding `"Ready"`), then reads and never replies.
fn silent_sandbox() -> ! {
    let mut stdin = std::io::stdin();
    let mut len = [0u8; 4];
    stdin.read_exact(&mut len).unwrap();
    let mut init = vec![0u8; u32::from_le_bytes(len) as usize];
    stdin.read_exact(&mut init).unwrap();
    let ready = b"\"Ready\"";
    let mut stdout = std::io::stdout();
    stdout
        .write_all(&(ready.len() as u32).to_le_bytes())
        .unwrap();
    stdout.write_all(ready).unwrap();
    stdout.flush().unwrap();
    let mut sink = Vec::new();
    let _ = stdin.read_to_end(&mut sink);
    std::process::exit(0)
}
