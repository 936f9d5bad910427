//! Layered configuration for `tessera serve`: a TOML file (`--config FILE`) <
//! environment variables `TESSERA_<KEY>` < command-line flags.
//!
//! Every key is a `serve` flag's long name with `_` for `-` (`max_num_seqs` is
//! `--max-num-seqs`, its variable `TESSERA_MAX_NUM_SEQS`), or the global `log_format`.
//! The lower layers become flags inserted after `serve` (or `chat`, which takes the same
//! flags), and only for keys the higher layers leave unset, so clap parses every value
//! exactly as if it had been typed, and list-valued flags (`api_key`) come whole from
//! one layer. Each value from a file or a variable is checked by its flag's parser
//! first, so a bad one is refused naming the file and key, or the variable, not a flag
//! nobody typed. A file key that is not a flag is an error naming the key and the file:
//! a typo must not be silently ignored.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{ArgAction, ArgMatches, Command};

use crate::config_values;

/// Flags that steer the layering itself and are not configuration keys.
const NOT_KEYS: &[&str] = &["config", "print-config", "help", "version"];

/// The subcommands that take the `serve` flags, and so the layers.
const LAYERED: &[&str] = &["serve", "chat"];

/// Keys whose values are secrets: shown as `<redacted>` by `--print-config`.
const SECRET_KEYS: &[&str] = &["api_key"];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid TOML: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("unknown key `{key}` in {path} (known keys: {known})")]
    UnknownKey {
        key: String,
        path: PathBuf,
        known: String,
    },
    #[error("key `{key}` in {path}: {message}")]
    BadValue {
        key: String,
        path: PathBuf,
        message: String,
    },
    #[error("environment variable {var}: {message}")]
    BadEnv { var: String, message: String },
}

/// A value `--print-config` shows for a key no layer set and clap has no default for:
/// the one start-up will use, as far as it is known before the model is read.
#[derive(Debug, Clone)]
pub enum Derived {
    Value(toml_edit::Value),
    /// Known only once the model is loaded: a comment saying where it comes from.
    Note(String),
}

/// A configurable flag of `serve`.
struct Key {
    name: String,
    long: String,
    multiple: bool,
    /// A switch (`--no-ui`): its value is `true` or `false`, and only `true` sets it.
    switch: bool,
    arg: clap::Arg,
}

/// The configuration keys: every `serve` flag, and the global flags of `cli` (whose
/// `serve` subcommand is `serve`).
fn keys(cli: &Command, serve: &Command) -> Vec<Key> {
    let globals = cli.get_arguments().filter(|a| a.is_global_set());
    serve
        .get_arguments()
        .chain(globals)
        // Hidden flags are test hooks: never set from a file or the environment.
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let long = a.get_long()?;
            (!NOT_KEYS.contains(&long)).then(|| Key {
                name: long.replace('-', "_"),
                long: long.to_string(),
                multiple: matches!(a.get_action(), ArgAction::Append),
                switch: matches!(a.get_action(), ArgAction::SetTrue),
                arg: a.clone(),
            })
        })
        .collect()
}

/// Every configuration key, in the order `--help` lists the flags.
pub fn key_names(cli: &Command) -> Vec<String> {
    match cli.find_subcommand("serve") {
        Some(serve) => keys(cli, serve).into_iter().map(|k| k.name).collect(),
        None => Vec::new(),
    }
}

/// Checks `value` with the flag's own parser (on a command of that flag alone):
/// `Err(message)` as clap words it.
fn check_value(key: &Key, value: &str) -> Result<(), String> {
    if key.switch {
        return match value {
            "true" | "false" => Ok(()),
            other => Err(format!("invalid value '{other}': expected true or false")),
        };
    }
    clap::Command::new("tessera")
        .no_binary_name(true)
        .arg(key.arg.clone())
        .try_get_matches_from([format!("--{}={value}", key.long)])
        .map(|_| ())
        .map_err(|e| {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            first.trim_start_matches("error: ").to_string()
        })
}

/// The value of `--flag VALUE` / `--flag=VALUE` among `args`, if present.
fn flag_value(args: &[OsString], long: &str) -> Option<OsString> {
    let bare = format!("--{long}");
    let prefixed = format!("--{long}=");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == bare {
            return it.next().cloned();
        }
        if let Some(v) = s.strip_prefix(&prefixed) {
            return Some(v.into());
        }
    }
    None
}

fn has_flag(args: &[OsString], long: &str) -> bool {
    let bare = format!("--{long}");
    let prefixed = format!("--{long}=");
    args.iter().any(|a| {
        let s = a.to_string_lossy();
        s == bare || s.starts_with(&prefixed)
    })
}

/// Flags (`--long=value`) for every key of the TOML file at `path`.
fn file_flags(path: &Path, keys: &[Key]) -> Result<Vec<(String, Vec<String>)>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let doc: toml_edit::DocumentMut =
        text.parse()
            .map_err(|e: toml_edit::TomlError| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
    let mut out = Vec::new();
    for (name, item) in doc.as_table().iter() {
        let Some(key) = keys.iter().find(|k| k.name == name) else {
            return Err(ConfigError::UnknownKey {
                key: name.to_string(),
                path: path.to_path_buf(),
                known: keys
                    .iter()
                    .map(|k| k.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let bad = |message: &str| ConfigError::BadValue {
            key: name.to_string(),
            path: path.to_path_buf(),
            message: message.to_string(),
        };
        let values = config_values::flag_values(name, item, key.multiple).map_err(|m| bad(&m))?;
        for v in &values {
            check_value(key, v).map_err(|m| bad(&m))?;
        }
        out.push((key.long.clone(), values));
    }
    Ok(out)
}

/// The environment variable of a key: `TESSERA_` and the key in capitals.
pub fn env_name(key: &str) -> String {
    format!("TESSERA_{}", key.to_ascii_uppercase())
}

/// `argv` with the file and environment layers inserted after `serve` (or `chat`) as
/// flags, for keys the command line leaves unset. Other commands pass through
/// unchanged.
pub fn layered_argv(
    cli: &Command,
    argv: Vec<OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<OsString>, ConfigError> {
    let Some(serve) = cli.find_subcommand("serve") else {
        return Ok(argv);
    };
    let Some(at) = argv
        .iter()
        .skip(1)
        .position(|a| LAYERED.iter().any(|c| a == c))
        .map(|i| i + 1)
    else {
        return Ok(argv);
    };
    // Global flags typed before the subcommand count as set too.
    let user = &argv[at + 1..];
    // A chat with a server elsewhere loads nothing here: no layer applies.
    if argv[at] == "chat" && has_flag(user, "url") {
        return Ok(argv);
    }
    let before = &argv[1..at];
    let keys = keys(cli, serve);
    let config_path = flag_value(user, "config")
        .map(PathBuf::from)
        .or_else(|| env("TESSERA_CONFIG").map(PathBuf::from));
    let from_file = match &config_path {
        Some(path) => file_flags(path, &keys)?,
        None => Vec::new(),
    };
    let mut inserted: Vec<OsString> = Vec::new();
    for key in &keys {
        if has_flag(user, &key.long) || has_flag(before, &key.long) {
            continue;
        }
        let var = env_name(&key.name);
        let values = match env(&var) {
            Some(v) => {
                check_value(key, &v).map_err(|message| ConfigError::BadEnv {
                    var: var.clone(),
                    message,
                })?;
                vec![v]
            }
            None => match from_file.iter().find(|(long, _)| *long == key.long) {
                Some((_, values)) => values.clone(),
                None => continue,
            },
        };
        if key.switch {
            // A switch takes no value: `true` is the bare flag, `false` leaves it off.
            if values.iter().any(|v| v == "true") {
                inserted.push(OsString::from(format!("--{}", key.long)));
            }
            continue;
        }
        inserted.extend(
            values
                .into_iter()
                .map(|v| OsString::from(format!("--{}={v}", key.long))),
        );
    }
    let mut out = argv[..=at].to_vec();
    out.extend(inserted);
    out.extend_from_slice(user);
    Ok(out)
}

/// The effective `serve` configuration as TOML (what `--print-config` shows): every
/// key with its value after layering and defaults, then `derived` for keys with neither
/// (values start-up computes: the default model, the port, the KV cache size); secrets
/// redacted. `matches` are the `serve` subcommand's (which hold the global flags too).
pub fn render(
    cli: &Command,
    serve: &Command,
    matches: &ArgMatches,
    derived: &[(&str, Derived)],
) -> String {
    let mut doc = toml_edit::DocumentMut::new();
    let mut notes = String::new();
    for key in keys(cli, serve) {
        let id = key.arg.get_id().as_str().to_string();
        let Some(raw) = matches.get_raw(&id).filter(|r| r.len() > 0) else {
            match derived.iter().find(|(name, _)| *name == key.name) {
                Some((_, Derived::Value(v))) => {
                    doc[key.name.as_str()] = toml_edit::value(v.clone())
                }
                Some((_, Derived::Note(why))) => {
                    notes.push_str(&format!("# {}: {why}\n", key.name));
                }
                None => {}
            }
            continue;
        };
        let values: Vec<String> = raw.map(|v| v.to_string_lossy().into_owned()).collect();
        let to_value = |s: &str| -> toml_edit::Value {
            if SECRET_KEYS.contains(&key.name.as_str()) {
                "<redacted>".into()
            } else if let Ok(i) = s.parse::<i64>() {
                i.into()
            } else if let Ok(f) = s.parse::<f64>() {
                f.into()
            } else if let Ok(b) = s.parse::<bool>() {
                b.into()
            } else {
                s.into()
            }
        };
        let value = if key.multiple {
            toml_edit::Value::Array(values.iter().map(|s| to_value(s)).collect())
        } else {
            match values.first() {
                Some(v) => to_value(v),
                None => continue,
            }
        };
        doc[key.name.as_str()] = toml_edit::value(value);
    }
    let mut text = doc.to_string();
    if !notes.is_empty() {
        text.push_str("\n# Known once the model is loaded:\n");
        text.push_str(&notes);
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use clap::{CommandFactory, FromArgMatches};

    use super::*;
    use crate::cli::{Cli, Command as CliCommand};

    fn parse(argv: &[&str], env: &[(&str, &str)]) -> Result<(Cli, ArgMatches), ConfigError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let argv = argv.iter().map(OsString::from).collect();
        let argv = layered_argv(&Cli::command(), argv, |k| env.get(k).cloned())?;
        let matches = Cli::command().try_get_matches_from(argv).unwrap();
        Ok((Cli::from_arg_matches(&matches).unwrap(), matches))
    }

    fn serve(cli: Cli) -> crate::serve::ServeArgs {
        match cli.command {
            CliCommand::Serve(args) => args,
            _ => panic!("expected serve"),
        }
    }

    fn render_plain(m: &ArgMatches) -> String {
        let cmd = Cli::command();
        let serve_cmd = cmd.find_subcommand("serve").unwrap();
        render(&cmd, serve_cmd, m.subcommand_matches("serve").unwrap(), &[])
    }

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tessera-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A table in a file reaches the flag as its JSON (every form: `config_values`).
    #[test]
    fn speculative_config_is_a_table_or_a_json_string() {
        let section =
            "port = 9000\n[speculative_config]\nmethod = \"mtp\"\nnum_speculative_tokens = 2\n";
        let path = write("section.toml", section);
        let (cli, _) = parse(
            &["tessera", "serve", "--config", path.to_str().unwrap()],
            &[],
        )
        .unwrap();
        let text = serve(cli).speculative_config.expect("a speculative config");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            serde_json::json!({"method": "mtp", "num_speculative_tokens": 2})
        );
        // Other keys take no table.
        let path = write("table.toml", "[port]\nvalue = 1\n");
        let err = parse(
            &["tessera", "serve", "--config", path.to_str().unwrap()],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("port") && err.contains("not a table"), "{err}");
    }

    #[test]
    fn file_then_env_then_flags() {
        let path = write(
            "layers.toml",
            "max_num_seqs = 8\nmax_waiting = 9\nport = 9000\nallowed_origins = [\"https://a\", \"https://b\"]\n",
        );
        let path = path.to_str().unwrap();
        let (cli, _) = parse(
            &["tessera", "serve", "--config", path, "--port", "9100"],
            &[("TESSERA_MAX_WAITING", "19"), ("TESSERA_PORT", "9050")],
        )
        .unwrap();
        let args = serve(cli);
        assert_eq!(args.max_num_seqs, 8, "file");
        assert_eq!(args.max_waiting, 19, "env over file");
        assert_eq!(args.port, Some(9100), "flag over env and file");
        assert_eq!(args.allowed_origins, ["https://a", "https://b"]);
        assert_eq!(args.max_batch_tokens, None, "default");
    }

    #[test]
    fn the_step_budget_defaults_by_device_kind() {
        use tessera_engine::DeviceSpec;
        let cpus = [DeviceSpec::Cpu(0), DeviceSpec::Cpu(1)];
        assert_eq!(crate::serve::default_max_batch_tokens(&cpus), 256);
        let gpus = [DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)];
        assert_eq!(crate::serve::default_max_batch_tokens(&gpus), 2048);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key_and_file() {
        let path = write("typo.toml", "max_num_seq = 8\n");
        let err = parse(
            &["tessera", "serve", "--config", path.to_str().unwrap()],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`max_num_seq`"), "{err}");
        assert!(err.contains("typo.toml"), "{err}");
        assert!(err.contains("max_num_seqs"), "lists the known keys: {err}");
        let path = write("list.toml", "port = [1, 2]\n");
        let err = parse(
            &["tessera", "serve", "--config", path.to_str().unwrap()],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`port`") && err.contains("list.toml"), "{err}");
    }

    #[test]
    fn the_default_config_file_is_accepted_and_matches_the_defaults() {
        let default = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/default.toml");
        let (_, with_file) = parse(&["tessera", "serve", "--config", default], &[]).unwrap();
        let (_, plain) = parse(&["tessera", "serve"], &[]).unwrap();
        assert_eq!(render_plain(&with_file), render_plain(&plain));
    }

    /// `config/default.toml` lists every key: a flag added without its key (set, or
    /// commented out where it has no default) fails here.
    #[test]
    fn the_default_config_file_lists_every_key() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../config/default.toml"
        ))
        .unwrap();
        let listed = |key: &str| {
            text.lines().any(|line| {
                let line = line.trim_start_matches('#').trim_start();
                line.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            })
        };
        let keys = key_names(&Cli::command());
        assert!(keys.len() > 40, "{keys:?}");
        for key in [
            "log_format",
            "tokenizer",
            "chat_template",
            "reasoning_parser",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} is a key: {keys:?}");
        }
        let missing: Vec<&String> = keys.iter().filter(|k| !listed(k)).collect();
        assert!(missing.is_empty(), "config/default.toml lacks {missing:?}");
    }

    /// A switch is a boolean key: `true` sets it, `false` leaves it off, and what
    /// `--print-config` prints reads back.
    #[test]
    fn a_switch_is_a_boolean_key() {
        let on = write("switch-on.toml", "no_ui = true\n");
        let (cli, m) = parse(&["tessera", "serve", "--config", on.to_str().unwrap()], &[]).unwrap();
        assert!(serve(cli).no_ui);
        assert!(render_plain(&m).lines().any(|l| l == "no_ui = true"));
        let (cli, m) = parse(&["tessera", "serve"], &[("TESSERA_NO_UI", "false")]).unwrap();
        assert!(!serve(cli).no_ui);
        let printed = render_plain(&m);
        assert!(printed.lines().any(|l| l == "no_ui = false"), "{printed}");
        let off = write("switch-off.toml", &printed);
        let (cli, _) = parse(
            &["tessera", "serve", "--config", off.to_str().unwrap()],
            &[],
        )
        .unwrap();
        assert!(!serve(cli).no_ui);
        let err = parse(&["tessera", "serve"], &[("TESSERA_NO_UI", "yes")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TESSERA_NO_UI") && err.contains("expected true or false"),
            "{err}"
        );
    }

    #[test]
    fn log_format_is_a_key_of_files_and_variables() {
        use crate::cli::LogFormat;
        let path = write("log.toml", "log_format = \"json\"\n");
        let (cli, _) = parse(
            &["tessera", "serve", "--config", path.to_str().unwrap()],
            &[],
        )
        .unwrap();
        assert_eq!(cli.log_format, LogFormat::Json);
        // A flag before the subcommand wins over the file.
        let (cli, _) = parse(
            &[
                "tessera",
                "--log-format",
                "text",
                "serve",
                "--config",
                path.to_str().unwrap(),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(cli.log_format, LogFormat::Text);
    }

    #[test]
    fn bad_values_name_the_file_or_the_variable_they_came_from() {
        let path = write("bad.toml", "max_num_seqs = \"many\"\n");
        let err = parse(
            &["tessera", "serve", "--config", path.to_str().unwrap()],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("key `max_num_seqs` in "), "{err}");
        assert!(err.contains("bad.toml") && err.contains("'many'"), "{err}");
        let err = parse(&["tessera", "serve"], &[("TESSERA_MAX_NUM_SEQS", "-3")])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("environment variable TESSERA_MAX_NUM_SEQS: ") && err.contains("'-3'"),
            "{err}"
        );
        let err = parse(
            &["tessera", "serve"],
            &[("TESSERA_REASONING_PARSER", "psychic")],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("TESSERA_REASONING_PARSER") && err.contains("psychic"),
            "{err}"
        );
        // Each value of a list is checked.
        let err = parse(&["tessera", "serve"], &[("TESSERA_TENSOR_SPLIT", "3,x")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TESSERA_TENSOR_SPLIT") && err.contains("'x'"),
            "{err}"
        );
    }

    #[test]
    fn print_config_shows_effective_values_and_hides_keys() {
        let (_, m) = parse(
            &["tessera", "serve", "--max-num-seqs", "3"],
            &[("TESSERA_API_KEY", "sk-secret")],
        )
        .unwrap();
        let text = render_plain(&m);
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        assert_eq!(doc["max_num_seqs"].as_integer(), Some(3), "{text}");
        assert_eq!(doc["host"].as_str(), Some("127.0.0.1"), "{text}");
        assert_eq!(doc["shutdown_timeout"].as_integer(), Some(30), "{text}");
        assert!(!text.contains("sk-secret"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
    }
}
