//! The command line as a newcomer meets it: `--help` grouped under headings,
//! `--print-config` with the values start-up derives, a bad value from the environment
//! or a config file named by where it came from, and `tessera models`.

use std::process::{Command, Output};

fn tessera(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run tessera")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The heading each option is listed under in `help`.
fn headings(help: &str) -> Vec<(String, String)> {
    let mut heading = String::new();
    let mut out = Vec::new();
    for line in help.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            heading = line.trim_end_matches(':').to_string();
        } else if let Some(flag) = line.trim_start().strip_prefix("--") {
            let flag = flag.split([' ', '=', '<']).next().unwrap_or_default();
            out.push((format!("--{flag}"), heading.clone()));
        }
    }
    out
}

#[test]
fn serve_help_groups_the_options_under_headings() {
    let out = tessera(&["serve", "--help"], &[]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    let found = headings(&help);
    let under = |flag: &str| {
        found
            .iter()
            .find(|(f, _)| f == flag)
            .map(|(_, h)| h.as_str())
            .unwrap_or_else(|| panic!("{flag} not in\n{help}"))
    };
    for (flag, heading) in [
        ("--model", "Model"),
        ("--revision", "Model"),
        ("--chat-template", "Model"),
        ("--tensor-parallel-size", "Devices and parallelism"),
        ("--kv-cache-memory-mib", "Devices and parallelism"),
        ("--nnodes", "Nodes"),
        ("--port", "HTTP"),
        ("--api-key", "HTTP"),
        ("--no-ui", "HTTP"),
        ("--max-num-seqs", "Limits and scheduling"),
        ("--request-timeout", "Limits and scheduling"),
        ("--log-format", "Logging"),
        ("--config", "Configuration"),
    ] {
        assert_eq!(under(flag), heading, "{flag}");
    }
    // Nothing is left under the catch-all but help and version.
    let loose: Vec<&String> = found
        .iter()
        .filter(|(f, h)| h == "Options" && f != "--help" && f != "--version")
        .map(|(f, _)| f)
        .collect();
    assert!(loose.is_empty(), "options without a heading: {loose:?}");
}

#[test]
fn print_config_shows_the_values_start_up_derives() {
    let out = tessera(&["serve", "--print-config"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let model = tessera_engine::default_model_path();
    for line in [
        format!("model = \"{}\"", model.display()),
        "port = 8000".to_string(),
        "max_batch_tokens = 256".to_string(),
        "devices = \"cpu:0\"".to_string(),
        "served_model_name = [\"SmolLM2-135M-Instruct.Q4_1\"]".to_string(),
        "log_format = \"text\"".to_string(),
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "'{line}' not in\n{printed}"
        );
    }
    assert!(
        printed.contains("# max_model_len: the model's context length"),
        "{printed}"
    );
    // One node's CPU cache is sized from free memory; a group's is fixed.
    assert!(
        printed.contains("# kv_cache_memory_mib: cpu_kv_cache_utilization of the memory"),
        "{printed}"
    );
    let out = tessera(
        &[
            "serve",
            "--print-config",
            "--nnodes",
            "2",
            "--tensor-parallel-size",
            "2",
        ],
        &[],
    );
    let printed = text(&out.stdout);
    assert!(
        printed.lines().any(|l| l == "kv_cache_memory_mib = 256"),
        "{printed}"
    );
    // GPU ranks: a larger step, and a cache sized at start-up.
    let out = tessera(&["serve", "--print-config", "--devices", "cuda:0"], &[]);
    let printed = text(&out.stdout);
    assert!(
        printed.lines().any(|l| l == "max_batch_tokens = 2048"),
        "{printed}"
    );
    assert!(
        printed.contains("# kv_cache_memory_mib: what gpu_memory_utilization leaves"),
        "{printed}"
    );
    // A hub model is served under its name as given.
    let out = tessera(
        &["serve", "--print-config", "--model", "org/repo:Q4_K_M"],
        &[],
    );
    let printed = text(&out.stdout);
    assert!(
        printed
            .lines()
            .any(|l| l == "served_model_name = [\"org/repo:Q4_K_M\"]"),
        "{printed}"
    );
}

#[test]
fn a_bad_value_names_the_variable_or_file_it_came_from() {
    let out = tessera(&["serve", "--print-config"], &[("TESSERA_PORT", "eighty")]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: environment variable TESSERA_PORT: invalid value 'eighty'"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("tessera-newcomer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "max_batch_tokens = -1\n").expect("write");
    let out = tessera(
        &[
            "serve",
            "--print-config",
            "--config",
            file.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("key `max_batch_tokens` in ") && err.contains("bad.toml"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn models_lists_every_family_with_its_file_names() {
    let out = tessera(&["models"], &[]);
    assert!(out.status.success());
    let listed = text(&out.stdout);
    for family in tessera_engine::families::table::families() {
        let line = listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(family.name))
            .unwrap_or_else(|| panic!("{} not in\n{listed}", family.name));
        for name in family.hf_names.iter().chain(family.gguf_names) {
            assert!(line.contains(name), "{name} not in '{line}'");
        }
    }
}
