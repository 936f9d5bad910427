//! Lookups in the family table ([`FAMILIES`]): a family by the name a file gives it, and
//! the lists of supported architectures that messages (and `--help`) give, all from the
//! table.

use crate::error::{EngineError, Result};
use crate::families::row::Row;
use crate::families::FAMILIES;
use crate::spec::family::Family;

/// Every family Tessera reads.
pub fn families() -> impl Iterator<Item = &'static Family> {
    FAMILIES.iter().map(|r| r.family)
}

/// The family a `config.json` names (its `model_type`, else its first `architectures`
/// entry).
pub(crate) fn hf_row(name: &str) -> Result<&'static Row> {
    FAMILIES
        .iter()
        .copied()
        .find(|r| r.family.hf_names.contains(&name))
        .ok_or_else(|| unknown(name))
}

/// The family a GGUF file's `general.architecture` names.
pub(crate) fn gguf_row(name: &str) -> Result<&'static Row> {
    FAMILIES
        .iter()
        .copied()
        .find(|r| r.family.gguf_names.contains(&name))
        .ok_or_else(|| unknown(name))
}

/// The architectures Tessera reads, as each format names them: every family's
/// `model_type`, and every GGUF `general.architecture`.
pub fn supported_architectures() -> String {
    let hf = listed(
        FAMILIES
            .iter()
            .filter_map(|r| r.family.hf_names.first().copied()),
    );
    format!(
        "config.json model_type {hf}; GGUF general.architecture {}",
        gguf_names_of(FAMILIES.iter())
    )
}

/// The GGUF names of `rows`' families, as a message lists them (`a, b and c`).
pub(crate) fn gguf_names_of<'a>(rows: impl Iterator<Item = &'a &'static Row>) -> String {
    listed(rows.flat_map(|r| r.family.gguf_names.iter().copied()))
}

/// The checkpoints read in their own quantization, as a message lists them
/// (`gpt_oss's mxfp4 ones`).
pub(crate) fn native_quantizations() -> String {
    listed(
        FAMILIES
            .iter()
            .filter(|r| !r.family.quantizations.is_empty())
            .map(|r| {
                format!(
                    "{}'s {} ones",
                    r.family.name,
                    r.family.quantizations.join("/")
                )
            }),
    )
}

fn unknown(name: &str) -> EngineError {
    EngineError::UnknownArchitecture {
        name: name.to_string(),
        supported: supported_architectures(),
    }
}

/// `a, b and c`.
fn listed<S: AsRef<str>>(names: impl Iterator<Item = S>) -> String {
    let names: Vec<S> = names.collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.as_ref().to_string(),
        Some((last, rest)) => {
            let rest: Vec<&str> = rest.iter().map(AsRef::as_ref).collect();
            format!("{} and {}", rest.join(", "), last.as_ref())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::loader::open::open;

    fn engine_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// The text of every test source under `dir`.
    fn sources(dir: &Path, out: &mut String) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                sources(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&std::fs::read_to_string(&path)?);
            }
        }
        Ok(())
    }

    /// Each name a file may give a family leads to that family alone.
    #[test]
    fn every_name_leads_to_its_family_alone() -> Result<()> {
        for &row in FAMILIES {
            assert!(!row.family.hf_names.is_empty(), "{}: no name", row.family);
            for name in row.family.hf_names {
                assert!(std::ptr::eq(hf_row(name)?, row), "{name}");
                let rows = FAMILIES.iter().filter(|r| r.family.hf_names.contains(name));
                assert_eq!(rows.count(), 1, "{name}");
            }
            for name in row.family.gguf_names {
                assert!(std::ptr::eq(gguf_row(name)?, row), "{name}");
                let rows = FAMILIES
                    .iter()
                    .filter(|r| r.family.gguf_names.contains(name));
                assert_eq!(rows.count(), 1, "{name}");
            }
        }
        Ok(())
    }

    /// The refusal of an unknown architecture lists every one the table holds.
    #[test]
    fn an_unknown_architecture_is_refused_with_the_supported_ones() {
        for err in [hf_row("mamba").err(), gguf_row("mamba").err()] {
            let message = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                message.starts_with("unsupported model architecture 'mamba'"),
                "{message}"
            );
            for &row in FAMILIES {
                let names = row.family.hf_names.iter().take(1);
                for name in names.chain(row.family.gguf_names) {
                    assert!(message.contains(name), "{name} missing from: {message}");
                }
            }
        }
    }

    /// Every family has a fixture test: its tiny model (made by transformers, with the
    /// logits transformers gave) reads as this family, from its folder and from its GGUF
    /// file where there is one, and a test in `crates/engine/tests` loads it.
    #[test]
    fn every_family_has_a_fixture_test() -> Result<()> {
        let fixtures = engine_dir().join("../../tests/fixtures/models");
        let mut tests = String::new();
        sources(&engine_dir().join("tests"), &mut tests)?;
        for &row in FAMILIES {
            let (family, fixture) = (row.family, row.fixture);
            let dir = fixtures.join(fixture);
            assert!(
                dir.join("reference.json").is_file(),
                "{family}: no fixture with reference logits at {}",
                dir.display()
            );
            let read = open(&dir)?.config().family;
            assert!(std::ptr::eq(read, family), "{fixture} reads as {read}");
            let gguf = fixtures.join(format!("{fixture}.gguf"));
            if gguf.is_file() && !family.gguf_names.is_empty() {
                let read = open(&gguf)?.config().family;
                assert!(std::ptr::eq(read, family), "{fixture}.gguf reads as {read}");
            }
            assert!(
                tests.contains(&format!("\"{fixture}\"")),
                "{family}: no test in crates/engine/tests loads {fixture}"
            );
        }
        Ok(())
    }
}
