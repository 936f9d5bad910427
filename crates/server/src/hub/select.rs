//! Which files of a repository make the model asked for: the GGUF file of a tag (all
//! parts of a split file, `-00001-of-00003.gguf`), a named GGUF file, or a safetensors
//! folder (its configuration, tokenizer and chat template files, then the weights its
//! index names).

use crate::hub::error::HubError;
use crate::hub::reference::{FileChoice, ModelRef};

/// The quantization llama-server picks when a GGUF repository holds several.
const DEFAULT_TAG: &str = "Q4_K_M";

/// What to download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// A GGUF file, or the parts of a split one (first part first): the model is the
    /// first file.
    Gguf(Vec<String>),
    /// A safetensors folder: `meta` first (configuration, tokenizer, chat template, the
    /// index), then the weights (see [`weights`]).
    Folder { meta: Vec<String> },
}

/// The index of a sharded safetensors checkpoint.
pub const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";

/// The plan for `model` among the repository's `files` (repository paths).
pub fn plan(model: &ModelRef, files: &[String]) -> Result<Plan, HubError> {
    match &model.choice {
        FileChoice::File(name) => {
            let found = files
                .iter()
                .find(|f| f.eq_ignore_ascii_case(name))
                .ok_or_else(|| no_match(model, &format!("has no file `{name}`"), files))?;
            Ok(Plan::Gguf(with_parts(found, files)))
        }
        FileChoice::Tag(tag) => {
            one_set(files, |f| has_tag(f, tag))
                .map(Plan::Gguf)
                .map_err(|sets| match sets {
                    0 => no_match(model, &format!("has no GGUF file tagged `{tag}`"), files),
                    n => no_match(
                        model,
                        &format!("has {n} GGUF files tagged `{tag}`; name one as `:FILE.gguf`"),
                        files,
                    ),
                })
        }
        FileChoice::Auto => {
            let top = |f: &&String| !f.contains('/');
            let has_config = files.iter().filter(top).any(|f| f == "config.json");
            let has_weights = files
                .iter()
                .filter(top)
                .any(|f| f.ends_with(".safetensors"));
            if has_config && has_weights {
                let meta = files
                    .iter()
                    .filter(top)
                    .filter(|f| f.ends_with(".json") || f.ends_with(".jinja"))
                    .cloned()
                    .collect();
                return Ok(Plan::Folder { meta });
            }
            match one_set(files, |_| true) {
                Ok(set) => Ok(Plan::Gguf(set)),
                Err(0) => Err(no_match(
                    model,
                    "has neither a safetensors model (config.json and *.safetensors) nor a \
                     GGUF file",
                    files,
                )),
                Err(_) => one_set(files, |f| has_tag(f, DEFAULT_TAG))
                    .map(Plan::Gguf)
                    .map_err(|_| {
                        no_match(
                            model,
                            "has several GGUF files; choose one with `:TAG` (e.g. `:Q4_K_M`) \
                             or `:FILE.gguf`",
                            files,
                        )
                    }),
            }
        }
    }
}

/// The weight files of a safetensors folder: the shards its index names, else
/// `model.safetensors`, else every top-level `.safetensors` file.
pub fn weights(files: &[String], index: Option<&str>) -> Result<Vec<String>, String> {
    if let Some(text) = index {
        let index: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("{SAFETENSORS_INDEX}: {e}"))?;
        let map = index["weight_map"]
            .as_object()
            .ok_or_else(|| format!("{SAFETENSORS_INDEX} has no weight_map"))?;
        let mut shards: Vec<String> = map
            .values()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        shards.sort();
        shards.dedup();
        if let Some(bad) = shards
            .iter()
            .find(|s| s.contains("..") || s.starts_with('/'))
        {
            return Err(format!("{SAFETENSORS_INDEX} names the file `{bad}`"));
        }
        return Ok(shards);
    }
    if files.iter().any(|f| f == "model.safetensors") {
        return Ok(vec!["model.safetensors".to_string()]);
    }
    Ok(files
        .iter()
        .filter(|f| !f.contains('/') && f.ends_with(".safetensors"))
        .cloned()
        .collect())
}

/// The one GGUF file or split set among `files` that `pick` accepts; `Err(n)` when
/// there are `n` other than one. Projector files (`mmproj*`) are never the model.
fn one_set(files: &[String], pick: impl Fn(&str) -> bool) -> Result<Vec<String>, usize> {
    let mut sets: Vec<Vec<String>> = Vec::new();
    for f in files {
        let name = f.rsplit('/').next().unwrap_or(f);
        if !f.to_ascii_lowercase().ends_with(".gguf")
            || name.to_ascii_lowercase().starts_with("mmproj")
            || !pick(f)
        {
            continue;
        }
        match split_part(f) {
            Some((_, 1, _)) | None => sets.push(with_parts(f, files)),
            Some(_) => {} // joins its first part's set
        }
    }
    if sets.len() == 1 {
        Ok(sets.remove(0))
    } else {
        Err(sets.len())
    }
}

/// `file` and, when it is the first part of a split GGUF file, the other parts in order.
fn with_parts(file: &str, files: &[String]) -> Vec<String> {
    let Some((stem, 1, count)) = split_part(file) else {
        return vec![file.to_string()];
    };
    (1..=count)
        .map(|i| {
            let part = format!("{stem}-{i:05}-of-{count:05}.gguf");
            files
                .iter()
                .find(|f| f.eq_ignore_ascii_case(&part))
                .cloned()
                .unwrap_or(part)
        })
        .collect()
}

/// `(stem, part, count)` of a split GGUF file name `STEM-00001-of-00003.gguf`.
pub fn split_part(file: &str) -> Option<(&str, usize, usize)> {
    let base = file.strip_suffix(".gguf")?;
    let (rest, count) = base.rsplit_once("-of-")?;
    let (stem, part) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.chars().all(|c| c.is_ascii_digit());
    if !digits(part) || !digits(count) {
        return None;
    }
    let (part, count) = (part.parse().ok()?, count.parse().ok()?);
    (part >= 1 && part <= count).then_some((stem, part, count))
}

/// Whether the file name carries `tag` as a whole word (`Q4_K` is not in `Q4_K_M`),
/// in any case, in its name or its folder's.
fn has_tag(file: &str, tag: &str) -> bool {
    let file = file.to_ascii_lowercase();
    let tag = tag.to_ascii_lowercase();
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    file.match_indices(&tag).any(|(at, _)| {
        !word(file[..at].chars().next_back()) && !word(file[at + tag.len()..].chars().next())
    })
}

fn no_match(model: &ModelRef, what: &str, files: &[String]) -> HubError {
    let ggufs: Vec<&str> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .filter(|f| split_part(f).is_none_or(|(_, part, _)| part == 1))
        .map(String::as_str)
        .collect();
    let listing = if ggufs.is_empty() {
        String::new()
    } else {
        format!("; its GGUF files: {}", ggufs.join(", "))
    };
    HubError::NoMatch(format!(
        "`{}` (revision `{}`) {what}{listing}",
        model.repo, model.revision
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn model(text: &str) -> ModelRef {
        ModelRef::parse(text, None).unwrap()
    }

    const GGUF_REPO: &[&str] = &[
        "README.md",
        "m-Q4_K.gguf",
        "m-Q4_K_M.gguf",
        "m-Q8_0-00001-of-00002.gguf",
        "m-Q8_0-00002-of-00002.gguf",
        "mmproj-m-f16.gguf",
    ];

    #[test]
    fn tags_pick_whole_words_and_split_sets() {
        let f = files(GGUF_REPO);
        assert_eq!(
            plan(&model("o/r:Q4_K_M"), &f).unwrap(),
            Plan::Gguf(files(&["m-Q4_K_M.gguf"]))
        );
        assert_eq!(
            plan(&model("o/r:q4_k"), &f).unwrap(),
            Plan::Gguf(files(&["m-Q4_K.gguf"]))
        );
        assert_eq!(
            plan(&model("o/r:Q8_0"), &f).unwrap(),
            Plan::Gguf(files(&[
                "m-Q8_0-00001-of-00002.gguf",
                "m-Q8_0-00002-of-00002.gguf"
            ]))
        );
        assert_eq!(
            plan(&model("o/r:m-Q8_0-00001-of-00002.gguf"), &f).unwrap(),
            plan(&model("o/r:Q8_0"), &f).unwrap()
        );
        let err = plan(&model("o/r:Q5_0"), &f).unwrap_err().to_string();
        assert!(err.contains("no GGUF file tagged `Q5_0`"), "{err}");
        assert!(err.contains("m-Q4_K_M.gguf") && err.contains("m-Q8_0-00001-of-00002.gguf"));
        assert!(!err.contains("00002-of"), "lists a split set once: {err}");
    }

    #[test]
    fn a_repository_without_a_tag_gives_its_one_model_or_q4_k_m() {
        assert_eq!(
            plan(&model("o/r"), &files(GGUF_REPO)).unwrap(),
            Plan::Gguf(files(&["m-Q4_K_M.gguf"]))
        );
        assert_eq!(
            plan(&model("o/r"), &files(&["x.Q4_1.gguf", "mmproj-x.gguf"])).unwrap(),
            Plan::Gguf(files(&["x.Q4_1.gguf"]))
        );
        let err = plan(&model("o/r"), &files(&["a-Q8_0.gguf", "a-Q6_K.gguf"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("choose one with `:TAG`"), "{err}");
        let err = plan(&model("o/r"), &files(&["README.md"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("neither a safetensors model"), "{err}");
    }

    #[test]
    fn a_safetensors_folder_takes_its_metadata_then_the_indexed_shards() {
        let f = files(&[
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "consolidated.safetensors",
            SAFETENSORS_INDEX,
            "tokenizer.json",
            "chat_template.jinja",
            "onnx/model.json",
            "pytorch_model.bin",
        ]);
        let Plan::Folder { meta } = plan(&model("o/r"), &f).unwrap() else {
            panic!("a folder");
        };
        assert_eq!(
            meta,
            files(&[
                "config.json",
                SAFETENSORS_INDEX,
                "tokenizer.json",
                "chat_template.jinja"
            ])
        );
        let index = r#"{"weight_map": {"a": "model-00002-of-00002.safetensors",
                        "b": "model-00001-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}"#;
        assert_eq!(
            weights(&f, Some(index)).unwrap(),
            files(&[
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ])
        );
        assert!(weights(&f, Some(r#"{"weight_map": {"a": "../x"}}"#)).is_err());
        assert_eq!(
            weights(&files(&["config.json", "model.safetensors"]), None).unwrap(),
            files(&["model.safetensors"])
        );
    }

    #[test]
    fn split_names() {
        assert_eq!(split_part("a/b-00002-of-00003.gguf"), Some(("a/b", 2, 3)));
        assert_eq!(split_part("b-2-of-3.gguf"), None);
        assert_eq!(split_part("b-00004-of-00003.gguf"), None);
        assert_eq!(split_part("b.gguf"), None);
    }
}
