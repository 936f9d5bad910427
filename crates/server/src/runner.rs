//! What the server runs its model for: generating text (the default) or embeddings
//! (`--runner pooling`, vLLM's name), and how an embedding model pools its final hidden
//! states: `--pooling`, else the model's sentence-transformers files (`modules.json`
//! and its pooling module's `config.json`), else a GGUF file's `pooling_type`, else the
//! last token (decoder embedders such as Qwen3-Embedding).

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tessera_protocol::{Pooling, PoolingKind};

/// `--runner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RunnerKind {
    /// Chat, completions, Responses and Messages.
    #[default]
    Generate,
    /// `/v1/embeddings` only.
    Pooling,
}

/// `--pooling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PoolingFlag {
    Last,
    Mean,
    Cls,
}

impl From<PoolingFlag> for PoolingKind {
    fn from(f: PoolingFlag) -> Self {
        match f {
            PoolingFlag::Last => PoolingKind::Last,
            PoolingFlag::Mean => PoolingKind::Mean,
            PoolingFlag::Cls => PoolingKind::Cls,
        }
    }
}

/// The runner the server was started as.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Runner {
    #[default]
    Generate,
    Pooling(PoolingSetup),
}

/// How an embedding model's requests are pooled.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolingSetup {
    pub pooling: Pooling,
    /// The model's embedding width.
    pub hidden_size: usize,
    /// The widths `dimensions` may ask for (Matryoshka training); `None`: the model was
    /// not trained for any but its own, so `dimensions` is refused; empty: any width.
    pub matryoshka: Option<Vec<usize>>,
}

impl Runner {
    /// The runner of `kind` for the model at `model_path` with `hidden_size`.
    pub fn resolve(
        kind: RunnerKind,
        flag: Option<PoolingFlag>,
        normalize: bool,
        model_path: &Path,
        hidden_size: usize,
    ) -> Result<Runner> {
        if kind == RunnerKind::Generate {
            if flag.is_some() {
                bail!("--pooling applies to --runner pooling only");
            }
            return Ok(Runner::Generate);
        }
        let folder = match model_path.is_dir() {
            true => model_path,
            false => model_path.parent().unwrap_or(Path::new(".")),
        };
        let (kind, source) = match flag {
            Some(f) => (f.into(), "--pooling".to_string()),
            None => match sentence_transformers_pooling(folder)? {
                Some(found) => found,
                None => match gguf_pooling(model_path)? {
                    Some(found) => found,
                    None => (PoolingKind::Last, "the default for decoders".to_string()),
                },
            },
        };
        tracing::info!(
            "embedding model: {} pooling (from {source}){}",
            kind.as_str(),
            if normalize { ", normalized" } else { "" }
        );
        Ok(Runner::Pooling(PoolingSetup {
            pooling: Pooling { kind, normalize },
            hidden_size,
            matryoshka: matryoshka_dimensions(folder),
        }))
    }

    pub fn pooling(&self) -> Option<&PoolingSetup> {
        match self {
            Runner::Pooling(p) => Some(p),
            Runner::Generate => None,
        }
    }
}

/// The pooling of a sentence-transformers model folder: its `modules.json` names a
/// `Pooling` module whose `config.json` sets one `pooling_mode_*`.
fn sentence_transformers_pooling(folder: &Path) -> Result<Option<(PoolingKind, String)>> {
    let modules_path = folder.join("modules.json");
    let Ok(text) = std::fs::read_to_string(&modules_path) else {
        return Ok(None);
    };
    let modules: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", modules_path.display()))?;
    let pooling_dir = modules
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| {
            m["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("models.Pooling"))
        })
        .and_then(|m| m["path"].as_str());
    let Some(dir) = pooling_dir else {
        return Ok(None);
    };
    let config_path = folder.join(dir).join("config.json");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?,
    )
    .with_context(|| format!("{} is not JSON", config_path.display()))?;
    let on = |key: &str| config[key].as_bool().unwrap_or(false);
    let kind = match () {
        _ if on("pooling_mode_lasttoken") => PoolingKind::Last,
        _ if on("pooling_mode_mean_tokens") => PoolingKind::Mean,
        _ if on("pooling_mode_cls_token") => PoolingKind::Cls,
        _ => bail!(
            "{} asks for a pooling this server does not run (it runs last, mean and cls); \
             choose one with --pooling",
            config_path.display()
        ),
    };
    Ok(Some((kind, config_path.display().to_string())))
}

/// The pooling a GGUF file states (`<arch>.pooling_type`: 1 mean, 2 cls, 3 last).
fn gguf_pooling(path: &Path) -> Result<Option<(PoolingKind, String)>> {
    if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return Ok(None);
    }
    let gguf = tessera_engine::loader::GgufSource::open(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let Some((key, value)) = gguf
        .metadata()
        .iter()
        .find(|(k, _)| k.ends_with(".pooling_type"))
    else {
        return Ok(None);
    };
    let kind = match value.to_u32() {
        Ok(0) => return Ok(None),
        Ok(1) => PoolingKind::Mean,
        Ok(2) => PoolingKind::Cls,
        Ok(3) => PoolingKind::Last,
        other => bail!(
            "{}: `{key}` = {other:?} is a pooling this server does not run (it runs last, \
             mean and cls); choose one with --pooling",
            path.display()
        ),
    };
    Ok(Some((kind, format!("{key} in {}", path.display()))))
}

/// Widths a model was trained to be truncated to: `matryoshka_dimensions` in its
/// `config.json` (those widths), or `is_matryoshka: true` (any).
fn matryoshka_dimensions(folder: &Path) -> Option<Vec<usize>> {
    let text = std::fs::read_to_string(folder.join("config.json")).ok()?;
    let config: Value = serde_json::from_str(&text).ok()?;
    if let Some(dims) = config["matryoshka_dimensions"].as_array() {
        return Some(
            dims.iter()
                .filter_map(|d| d.as_u64().map(|d| d as usize))
                .collect(),
        );
    }
    config["is_matryoshka"]
        .as_bool()
        .filter(|m| *m)
        .map(|_| Vec::new())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A model folder holding `files`, removed when dropped.
    struct Folder(std::path::PathBuf);

    impl Folder {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn folder(files: &[(&str, &str)]) -> Folder {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tessera-runner-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        Folder(dir)
    }

    const MODULES: &str = r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]"#;

    fn resolve(dir: &Path, flag: Option<PoolingFlag>) -> Result<Runner> {
        Runner::resolve(RunnerKind::Pooling, flag, true, dir, 8)
    }

    /// A copy of the tiny Qwen3 GGUF fixture in `dir` whose metadata adds
    /// `qwen3.pooling_type = value`.
    fn gguf_with_pooling(dir: &Path, value: u32) -> std::path::PathBuf {
        use candle_core::quantized::gguf_file::{self, Value};
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/models/tiny-qwen3.gguf");
        let mut file = std::fs::File::open(&fixture).unwrap();
        let content = gguf_file::Content::read(&mut file).unwrap();
        let tensors: Vec<(String, candle_core::quantized::QTensor)> = content
            .tensor_infos
            .keys()
            .map(|name| {
                let t = content
                    .tensor(&mut file, name, &candle_core::Device::Cpu)
                    .unwrap();
                (name.clone(), t)
            })
            .collect();
        let mut metadata: Vec<(String, Value)> = content.metadata.into_iter().collect();
        metadata.push(("qwen3.pooling_type".into(), Value::U32(value)));
        let path = dir.join(format!("pooling-{value}.gguf"));
        let mut out = std::fs::File::create(&path).unwrap();
        gguf_file::write(
            &mut out,
            &metadata
                .iter()
                .map(|(k, v)| (k.as_str(), v))
                .collect::<Vec<_>>(),
            &tensors
                .iter()
                .map(|(k, t)| (k.as_str(), t))
                .collect::<Vec<_>>(),
        )
        .unwrap();
        path
    }

    #[test]
    fn a_gguf_files_pooling_type_chooses_the_pooling() {
        let dir = folder(&[]);
        for (value, kind) in [
            (1, PoolingKind::Mean),
            (2, PoolingKind::Cls),
            (3, PoolingKind::Last),
            // 0: none stated, a decoder's default.
            (0, PoolingKind::Last),
        ] {
            let path = gguf_with_pooling(dir.path(), value);
            let runner = resolve(&path, None).unwrap();
            assert_eq!(runner.pooling().unwrap().pooling.kind, kind, "{value}");
        }
        // The flag wins; a pooling the server does not run (4: rank) is refused, naming
        // the key and the flag.
        let path = gguf_with_pooling(dir.path(), 1);
        let flagged = resolve(&path, Some(PoolingFlag::Last)).unwrap();
        assert_eq!(flagged.pooling().unwrap().pooling.kind, PoolingKind::Last);
        let path = gguf_with_pooling(dir.path(), 4);
        let err = resolve(&path, None)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.contains("qwen3.pooling_type"), "{err}");
        assert!(err.contains("--pooling"), "{err}");
    }

    #[test]
    fn sentence_transformers_files_choose_the_pooling_and_the_flag_wins() {
        for (mode, kind) in [
            ("pooling_mode_lasttoken", PoolingKind::Last),
            ("pooling_mode_mean_tokens", PoolingKind::Mean),
            ("pooling_mode_cls_token", PoolingKind::Cls),
        ] {
            let config = format!(r#"{{"word_embedding_dimension": 8, "{mode}": true}}"#);
            let dir = folder(&[
                ("modules.json", MODULES),
                ("1_Pooling/config.json", &config),
            ]);
            let runner = resolve(dir.path(), None).unwrap();
            assert_eq!(runner.pooling().unwrap().pooling.kind, kind, "{mode}");
            let flagged = resolve(dir.path(), Some(PoolingFlag::Cls)).unwrap();
            assert_eq!(flagged.pooling().unwrap().pooling.kind, PoolingKind::Cls);
        }
    }

    #[test]
    fn an_unsupported_mode_is_refused_and_no_files_mean_last() {
        let dir = folder(&[
            ("modules.json", MODULES),
            (
                "1_Pooling/config.json",
                r#"{"pooling_mode_max_tokens": true}"#,
            ),
        ]);
        let err = resolve(dir.path(), None).unwrap_err().to_string();
        assert!(err.contains("--pooling"), "{err}");
        let empty = folder(&[]);
        let runner = resolve(empty.path(), None).unwrap();
        assert_eq!(runner.pooling().unwrap().pooling.kind, PoolingKind::Last);
        assert_eq!(runner.pooling().unwrap().matryoshka, None);
    }

    #[test]
    fn matryoshka_widths_come_from_the_config() {
        let dir = folder(&[("config.json", r#"{"matryoshka_dimensions": [4, 8]}"#)]);
        let runner = resolve(dir.path(), None).unwrap();
        assert_eq!(runner.pooling().unwrap().matryoshka, Some(vec![4, 8]));
        let any = folder(&[("config.json", r#"{"is_matryoshka": true}"#)]);
        assert_eq!(
            resolve(any.path(), None)
                .unwrap()
                .pooling()
                .unwrap()
                .matryoshka,
            Some(vec![])
        );
    }

    #[test]
    fn pooling_needs_the_pooling_runner() {
        let dir = folder(&[]);
        assert!(Runner::resolve(
            RunnerKind::Generate,
            Some(PoolingFlag::Mean),
            true,
            dir.path(),
            8
        )
        .is_err());
    }
}
