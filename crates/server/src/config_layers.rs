//! Layered configuration for `tessera serve`: a TOML file (`--config FILE`) <
//! environment variables `TESSERA_<KEY>` < command-line flags.
//!
//! Every key is a `serve` flag's long name with `_` for `-` (`max_num_seqs` is
//! `--max-num-seqs`, its variable `TESSERA_MAX_NUM_SEQS`). The lower layers become
//! flags inserted after `serve`, and only for keys the higher layers leave unset, so
//! clap parses and validates every value exactly as if it had been typed, and
//! list-valued flags (`api_key`) come whole from one layer. A file key that is not a
//! flag is an error naming the key and the file: a typo must not be silently ignored.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{ArgAction, ArgMatches, Command};

/// Flags that steer the layering itself and are not configuration keys.
const NOT_KEYS: &[&str] = &["config", "print-config", "help", "version"];

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
}

/// A configurable flag of `serve`.
struct Key {
    name: String,
    long: String,
    multiple: bool,
}

fn keys(serve: &Command) -> Vec<Key> {
    serve
        .get_arguments()
        // Hidden flags are test hooks: never set from a file or the environment.
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let long = a.get_long()?;
            (!NOT_KEYS.contains(&long)).then(|| Key {
                name: long.replace('-', "_"),
                long: long.to_string(),
                multiple: matches!(a.get_action(), ArgAction::Append),
            })
        })
        .collect()
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
        let value = item
            .as_value()
            .ok_or_else(|| bad("expected a value, not a table"))?;
        let values = match value.as_array() {
            Some(_) if !key.multiple => return Err(bad("takes one value, not a list")),
            Some(array) => array.iter().map(scalar).collect::<Option<Vec<_>>>(),
            None => scalar(value).map(|v| vec![v]),
        }
        .ok_or_else(|| bad("expected a string, number or boolean"))?;
        out.push((key.long.clone(), values));
    }
    Ok(out)
}

fn scalar(v: &toml_edit::Value) -> Option<String> {
    if let Some(s) = v.as_str() {
        Some(s.to_string())
    } else if let Some(i) = v.as_integer() {
        Some(i.to_string())
    } else if let Some(f) = v.as_float() {
        Some(f.to_string())
    } else {
        v.as_bool().map(|b| b.to_string())
    }
}

/// The environment variable of a key: `TESSERA_` and the key in capitals.
pub fn env_name(key: &str) -> String {
    format!("TESSERA_{}", key.to_ascii_uppercase())
}

/// `argv` with the file and environment layers inserted after `serve` as flags, for
/// keys the command line leaves unset. Other commands pass through unchanged.
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
        .position(|a| a == "serve")
        .map(|i| i + 1)
    else {
        return Ok(argv);
    };
    let user = &argv[at + 1..];
    let keys = keys(serve);
    let config_path = flag_value(user, "config")
        .map(PathBuf::from)
        .or_else(|| env("TESSERA_CONFIG").map(PathBuf::from));
    let from_file = match &config_path {
        Some(path) => file_flags(path, &keys)?,
        None => Vec::new(),
    };
    let mut inserted: Vec<OsString> = Vec::new();
    for key in &keys {
        if has_flag(user, &key.long) {
            continue;
        }
        let values = match env(&env_name(&key.name)) {
            Some(v) => vec![v],
            None => match from_file.iter().find(|(long, _)| *long == key.long) {
                Some((_, values)) => values.clone(),
                None => continue,
            },
        };
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
/// key with its value after layering and defaults; secrets redacted.
pub fn render(serve: &Command, matches: &ArgMatches) -> String {
    let mut doc = toml_edit::DocumentMut::new();
    for key in keys(serve) {
        let id = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(key.long.as_str()))
            .map(|a| a.get_id().as_str().to_string());
        let Some(raw) = id.as_deref().and_then(|id| matches.get_raw(id)) else {
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
    doc.to_string()
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
            CliCommand::Generate(_) => panic!("expected serve"),
        }
    }

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tessera-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
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
        let cmd = Cli::command();
        let serve_cmd = cmd.find_subcommand("serve").unwrap();
        let render_serve =
            |m: &ArgMatches| render(serve_cmd, m.subcommand_matches("serve").unwrap());
        assert_eq!(render_serve(&with_file), render_serve(&plain));
    }

    #[test]
    fn print_config_shows_effective_values_and_hides_keys() {
        let (_, m) = parse(
            &["tessera", "serve", "--max-num-seqs", "3"],
            &[("TESSERA_API_KEY", "sk-secret")],
        )
        .unwrap();
        let cmd = Cli::command();
        let text = render(
            cmd.find_subcommand("serve").unwrap(),
            m.subcommand_matches("serve").unwrap(),
        );
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        assert_eq!(doc["max_num_seqs"].as_integer(), Some(3), "{text}");
        assert_eq!(doc["host"].as_str(), Some("127.0.0.1"), "{text}");
        assert_eq!(doc["shutdown_timeout"].as_integer(), Some(30), "{text}");
        assert!(!text.contains("sk-secret"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
    }
}
