//! `tessera models`: the model families Tessera runs, as the engine's one family table
//! lists them, with the names each file format gives them and the checkpoints read in
//! their own quantization.

use std::io::Write;

use tessera_engine::families::table::families;

/// The table as text: a header, then one line per family.
pub fn table() -> String {
    let rows: Vec<[String; 4]> = families()
        .map(|f| {
            [
                f.name.to_string(),
                f.hf_names.join(", "),
                if f.gguf_names.is_empty() {
                    "(as another family)".to_string()
                } else {
                    f.gguf_names.join(", ")
                },
                f.quantizations.join(", "),
            ]
        })
        .collect();
    let header = [
        "FAMILY",
        "CONFIG.JSON (model_type, architectures)",
        "GGUF general.architecture",
        "QUANTIZED CHECKPOINTS",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: [&str; 4]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}  "));
            }
        }
        text.trim_end().to_string() + "\n"
    };
    let mut out = line(header);
    for row in &rows {
        out.push_str(&line([&row[0], &row[1], &row[2], &row[3]]));
    }
    out.push_str(
        "\nEvery family also loads from block-scaled FP8 safetensors; GGUF weights run in \
         their own quantization (see the README's Models section).\n",
    );
    out
}

pub fn run() -> anyhow::Result<()> {
    std::io::stdout().write_all(table().as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_of_the_table_is_a_line() {
        let text = table();
        let lines: Vec<&str> = text.lines().skip(1).take_while(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), families().count(), "{text}");
        for (line, family) in lines.iter().zip(families()) {
            assert!(line.starts_with(family.name), "{line}");
            for name in family.hf_names.iter().chain(family.gguf_names) {
                assert!(line.contains(name), "{name} in {line}");
            }
        }
        assert!(
            text.contains("Qwen3ForCausalLM") && text.contains("mxfp4"),
            "{text}"
        );
    }
}
