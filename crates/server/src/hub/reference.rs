//! What `--model` names when it is not a path here: a Hugging Face repository, and which
//! of its files to serve.
//!
//! The forms follow llama-server's `-hf` and vLLM's `--model`: `org/repo` (a safetensors
//! folder, or the repository's one GGUF file), `org/repo:Q4_K_M` (the GGUF file of that
//! quantization), `org/repo:name.gguf` (that file), with `--revision` for a branch, tag
//! or commit (vLLM's flag).

use std::fmt;

/// The branch a reference reads when no revision is given.
pub const DEFAULT_REVISION: &str = "main";

/// Which files of the repository make the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileChoice {
    /// A safetensors folder when the repository has one, else its one GGUF file (or one
    /// split set).
    Auto,
    /// The GGUF file (or split set) whose name carries this quantization tag.
    Tag(String),
    /// This GGUF file (the first part of a split set brings the others).
    File(String),
}

/// A model on the hub: repository, file choice and revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    /// `org/repo`.
    pub repo: String,
    pub choice: FileChoice,
    /// A branch, tag or commit.
    pub revision: String,
}

impl ModelRef {
    /// The reference `text` makes, or `None` when it cannot name a repository (a path:
    /// absolute, relative with `./`, or with more than one `/` before any `:`).
    pub fn parse(text: &str, revision: Option<&str>) -> Option<Self> {
        let (repo, choice) = match text.split_once(':') {
            Some((repo, rest)) => (repo, Some(rest)),
            None => (text, None),
        };
        let (org, name) = repo.split_once('/')?;
        if !is_repo_part(org) || !is_repo_part(name) {
            return None;
        }
        let choice = match choice {
            None => FileChoice::Auto,
            Some(rest) if !is_choice(rest) => return None,
            Some(file) if file.to_ascii_lowercase().ends_with(".gguf") => {
                FileChoice::File(file.to_string())
            }
            Some(tag) => FileChoice::Tag(tag.to_string()),
        };
        Some(ModelRef {
            repo: repo.to_string(),
            choice,
            revision: revision.unwrap_or(DEFAULT_REVISION).to_string(),
        })
    }

    /// The folder of this repository in the Hugging Face cache: `models--org--repo`.
    pub fn cache_folder_name(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repo)?;
        match &self.choice {
            FileChoice::Auto => Ok(()),
            FileChoice::Tag(t) | FileChoice::File(t) => write!(f, ":{t}"),
        }
    }
}

/// The hub's rule for an owner or repository name: letters, digits, `-`, `_` and `.`,
/// at most 96, not starting or ending with `-` or `.`, without `--` or `..`.
fn is_repo_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 96
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !part.starts_with(['-', '.'])
        && !part.ends_with(['-', '.'])
        && !part.contains("--")
        && !part.contains("..")
}

/// A tag or file name after `:`: the characters of repository names, and `/` between
/// folder names (no `..`, no leading `/`).
fn is_choice(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && !text.starts_with('/')
        && text
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_tags_and_files() {
        let r = ModelRef::parse("HuggingFaceTB/SmolLM2-135M-Instruct", None).expect("repo");
        assert_eq!(r.repo, "HuggingFaceTB/SmolLM2-135M-Instruct");
        assert_eq!(r.choice, FileChoice::Auto);
        assert_eq!(r.revision, "main");
        assert_eq!(
            r.cache_folder_name(),
            "models--HuggingFaceTB--SmolLM2-135M-Instruct"
        );
        let r = ModelRef::parse("bartowski/Qwen3-8B-GGUF:Q4_K_M", Some("v2")).expect("tag");
        assert_eq!(r.choice, FileChoice::Tag("Q4_K_M".into()));
        assert_eq!(r.revision, "v2");
        assert_eq!(r.to_string(), "bartowski/Qwen3-8B-GGUF:Q4_K_M");
        let r = ModelRef::parse("org/repo:Q8_0/model-Q8_0.GGUF", None).expect("file");
        assert_eq!(r.choice, FileChoice::File("Q8_0/model-Q8_0.GGUF".into()));
    }

    #[test]
    fn paths_are_not_repositories() {
        for path in [
            "/models/model.gguf",
            "./org/repo",
            "models/llama/model.gguf",
            "model.gguf",
            "org/",
            "-org/repo",
            "org/repo.",
            "org/re--po",
            "org/repo:",
            "org/repo:../x.gguf",
            "org/repo:a b",
            "C:/models/x",
        ] {
            assert_eq!(ModelRef::parse(path, None), None, "{path}");
        }
    }
}
