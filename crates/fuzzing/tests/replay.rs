//! Replays the committed fuzz seeds (`fuzz/seeds/<target>/`) and every input that ever
//! crashed a target (`fuzz/regressions/<target>/`) through the targets' checks, so a fixed
//! bug stays fixed under plain `cargo test`.

use std::panic::catch_unwind;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn inputs(target: &str) -> Vec<PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut files = Vec::new();
    for kind in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(kind).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if path.is_file() && !hidden {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_seed_and_regression_passes() {
    let mut failures = Vec::new();
    let mut count = 0;
    for &(target, check) in tessera_fuzzing::TARGETS {
        let files = inputs(target);
        assert!(!files.is_empty(), "no seeds for the fuzz target {target}");
        for file in files {
            let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let start = Instant::now();
            if catch_unwind(|| check(&data)).is_err() {
                failures.push(format!("{target}: {}", file.display()));
            }
            let took = start.elapsed();
            assert!(
                took.as_secs() < 5,
                "{target}: {} took {took:?}",
                file.display()
            );
            count += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "failing inputs:\n{}",
        failures.join("\n")
    );
    assert!(count > 0);
}
