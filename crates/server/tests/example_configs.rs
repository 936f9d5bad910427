//! Every example deployment in config/ is accepted, and its settings take effect.

use std::path::PathBuf;
use std::process::Command;

fn config_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config")
}

#[test]
fn every_example_config_is_accepted_and_printed() {
    let mut seen = 0;
    for entry in std::fs::read_dir(config_dir()).expect("config/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["serve", "--print-config", "--config"])
            .arg(&path)
            .output()
            .expect("run tessera");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // Each key the file sets shows up with its value in the effective config.
        let text = std::fs::read_to_string(&path).expect("read");
        for line in text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && l.contains('='))
        {
            let (key, value) = line.split_once('=').expect("key = value");
            let expected = format!("{} = {}", key.trim(), value.trim());
            // A list-valued key given one string prints as a list of one.
            let as_list = format!("{} = [{}]", key.trim(), value.trim());
            assert!(
                stdout.contains(&expected) || stdout.contains(&as_list),
                "{}: '{expected}' not in\n{stdout}",
                path.display()
            );
        }
        seen += 1;
    }
    assert!(
        seen >= 5,
        "expected default.toml and the four example deployments"
    );
}
