//! `tessera generate` as a user runs it: the real binary, the default model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tessera")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const FRANCE: &str = "What is the capital of France? Answer in one sentence.";

#[test]
fn chat_answers_the_capital_of_france() {
    let out = tessera(&[
        "generate",
        "--chat",
        "--prompt",
        FRANCE,
        "--temperature",
        "0",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        "The capital of France is Paris."
    );
    let err = stderr(&out);
    for stage in ["[1/3] weights", "[2/3] tokenizer", "[3/3] loaded in"] {
        assert!(
            err.contains(stage),
            "missing progress line '{stage}' in {err}"
        );
    }
}

#[test]
fn a_fixed_seed_reproduces_the_text() {
    let run = |seed: &str| {
        let out = tessera(&[
            "generate",
            "--prompt",
            "Once upon a time",
            "--max-tokens",
            "12",
            "--temperature",
            "1.0",
            "--seed",
            seed,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let a = run("7");
    assert_eq!(a, run("7"));
    assert_ne!(a, run("8"));
}

#[test]
fn tensor_parallel_generation_gives_the_same_answer() {
    let out = tessera(&[
        "generate",
        "--chat",
        "--prompt",
        FRANCE,
        "--temperature",
        "0",
        "--tensor-parallel-size",
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        "The capital of France is Paris."
    );
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// One clear `error:` line naming the problem, a non-zero exit, never a panic.
fn assert_clean_failure(model: &Path, expect: &str) {
    let out = tessera(&[
        "generate",
        "--model",
        &model.to_string_lossy(),
        "--prompt",
        "hi",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success(), "must fail: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(expect),
        "'{}' does not say '{expect}'",
        lines[0]
    );
}

fn default_model() -> PathBuf {
    std::env::var("TESSERA_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| tessera_engine::default_model_path())
}

#[test]
fn bad_models_fail_with_one_clear_error() {
    let bytes = std::fs::read(default_model()).expect("the default model (scripts/fetch-model)");

    let dir = scratch("truncated");
    let truncated = dir.join("model.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    assert_clean_failure(&truncated, "truncated");

    let garbage = dir.join("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a model").expect("write");
    assert_clean_failure(&garbage, "not a valid GGUF file");

    assert_clean_failure(&dir.join("missing.gguf"), "not found");

    let config = |arch: &str| {
        format!(
            r#"{{"model_type":"{arch}","vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2}}"#
        )
    };
    let no_weights = scratch("no-weights");
    std::fs::write(no_weights.join("config.json"), config("llama")).expect("write");
    assert_clean_failure(&no_weights, "no weights");

    let unknown = scratch("unknown-arch");
    std::fs::write(unknown.join("config.json"), config("mamba")).expect("write");
    assert_clean_failure(&unknown, "unsupported model architecture 'mamba'");
}

/// A tokenizer whose ids run past the model's embedding (here SmolLM2's 49152 tokens
/// with a test model of 512 rows) is refused at load with both sizes and the fix,
/// before any text is tokenized into ids the model has no row for.
#[test]
fn a_tokenizer_larger_than_the_embedding_is_refused_at_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = root.join("tests/fixtures/models/tiny-llama");
    let tokenizer = root.join("tests/fixtures/tokenizer/smollm2-hf");
    let out = tessera(&[
        "generate",
        "--model",
        model.to_str().expect("utf-8 path"),
        "--tokenizer",
        tokenizer.to_str().expect("utf-8 path"),
        "--prompt",
        "Hello",
        "--max-tokens",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = stderr(&out);
    assert!(
        err.contains("the tokenizer has a vocabulary of 49152 tokens but the model's token embedding has 512 rows")
            && err.contains("use the tokenizer that belongs to this model"),
        "{err}"
    );
}

/// `--prompt -` reads the prompt from standard input (its one trailing newline is not
/// part of it).
#[test]
fn a_prompt_of_dash_is_read_from_standard_input() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "generate",
            "--chat",
            "--prompt",
            "-",
            "--temperature",
            "0",
            "--kv-cache-memory-mib",
            "64",
        ])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tessera");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(format!("{FRANCE}\n").as_bytes())
        .expect("write the prompt");
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        "The capital of France is Paris."
    );
}

/// With `--log-format json` every line on standard error is a JSON log record, the
/// progress lines included.
#[test]
fn generate_logs_json_when_asked() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "--log-format",
            "json",
            "generate",
            "--prompt",
            "Hello",
            "--max-tokens",
            "2",
            "--kv-cache-memory-mib",
            "64",
        ])
        .env("RUST_LOG", "info")
        .output()
        .expect("run tessera");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let records: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let messages: Vec<&str> = records
        .iter()
        .filter_map(|r| r["fields"]["message"].as_str())
        .collect();
    for stage in [
        "[1/3] weights",
        "[2/3] tokenizer",
        "[3/3] loaded in",
        " tokens in ",
    ] {
        assert!(
            messages.iter().any(|m| m.contains(stage)),
            "no '{stage}' record in {messages:?}"
        );
    }
    // An error is a record too.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "--log-format",
            "json",
            "generate",
            "--model",
            "/no/such.gguf",
            "--prompt",
            "x",
        ])
        .output()
        .expect("run tessera");
    assert!(!out.status.success());
    let last = stderr(&out).lines().last().unwrap_or_default().to_string();
    let record: serde_json::Value = serde_json::from_str(&last).expect("a JSON record");
    assert_eq!(record["level"], "ERROR", "{last}");
}
