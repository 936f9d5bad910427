//! The transformers references committed with the random-weight fixtures.

use std::path::Path;

use serde_json::Value;

/// A fixture's prompts (`reference.json` in `dir`) and transformers' greedy
/// continuations; a continuation is given only where transformers' top two logits never
/// came within `1e-3` (as the engine's own tests assert it).
pub fn greedy_cases(dir: &Path) -> Vec<(Vec<u32>, Option<Vec<u32>>)> {
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference");
    let reference: Value = serde_json::from_str(&text).expect("json");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|t| t.as_u64().expect("id") as u32)
            .collect()
    };
    reference["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let gap = c["greedy_min_top2_gap"].as_f64().unwrap_or(0.0);
            (
                ids(&c["input_ids"]),
                (gap > 1e-3).then(|| ids(&c["greedy_ids"])),
            )
        })
        .collect()
}
