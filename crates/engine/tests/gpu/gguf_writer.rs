//! Writes a Hugging Face llama, qwen2 or qwen3 folder (config.json + safetensors) as a GGUF file
//! with its matrices quantized (Q4_1, Q8_0), the way llama.cpp's converter lays it out:
//! GGUF tensor names, llama's query and key rows permuted for interleaved RoPE, norms
//! and biases in f32.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;
use serde_json::Value as Json;
use tessera_engine::loader::gguf_name;

/// Rows of a query or key projection reordered from pairs (i, i + d/2) to (2i, 2i + 1).
fn permute_rows(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    let hd = rows / heads;
    w.reshape((heads, 2, hd / 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))
}

pub fn write_gguf(dir: &Path, dtype: GgmlDType, out: &Path) {
    let config: Json = serde_json::from_str(
        &std::fs::read_to_string(dir.join("config.json")).expect("config.json"),
    )
    .expect("config json");
    let get = |k: &str| config[k].as_u64().unwrap_or_else(|| panic!("config {k}")) as u32;
    let arch = match config["model_type"].as_str() {
        Some("qwen2") => "qwen2",
        Some("qwen3") => "qwen3",
        _ => "llama",
    };
    let heads = get("num_attention_heads") as usize;
    let kv_heads = get("num_key_value_heads") as usize;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for entry in std::fs::read_dir(dir).expect("model dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            tensors
                .extend(candle_core::safetensors::load(&path, &Device::Cpu).expect("safetensors"));
        }
    }
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    // Tensors are quantized in parallel: an 8B model has 290 of them.
    let quantized: Vec<(String, QTensor)> = names
        .par_iter()
        .filter_map(|hf| {
            let name = gguf_name(hf)?;
            let mut t = tensors[*hf].to_dtype(DType::F32).expect("f32");
            if arch == "llama" && hf.ends_with("q_proj.weight") {
                t = permute_rows(&t, heads).expect("permute q");
            }
            if arch == "llama" && hf.ends_with("k_proj.weight") {
                t = permute_rows(&t, kv_heads).expect("permute k");
            }
            let q = if t.rank() == 2 {
                QTensor::quantize(&t, dtype)
            } else {
                QTensor::quantize(&t, GgmlDType::F32)
            }
            .expect("quantize");
            Some((name, q))
        })
        .collect();
    let eps = config["rms_norm_eps"].as_f64().unwrap_or(1e-5) as f32;
    // transformers 5 writes RoPE settings under `rope_parameters`, older versions flat.
    let theta = config["rope_theta"]
        .as_f64()
        .or_else(|| config["rope_parameters"]["rope_theta"].as_f64())
        .unwrap_or(10_000.0) as f32;
    let key = |k: &str| format!("{arch}.{k}");
    let metadata: Vec<(String, gguf_file::Value)> = vec![
        (
            "general.architecture".into(),
            gguf_file::Value::String(arch.into()),
        ),
        (
            key("block_count"),
            gguf_file::Value::U32(get("num_hidden_layers")),
        ),
        (
            key("context_length"),
            gguf_file::Value::U32(get("max_position_embeddings")),
        ),
        (
            key("embedding_length"),
            gguf_file::Value::U32(get("hidden_size")),
        ),
        (
            key("feed_forward_length"),
            gguf_file::Value::U32(get("intermediate_size")),
        ),
        (
            key("attention.head_count"),
            gguf_file::Value::U32(heads as u32),
        ),
        (
            key("attention.head_count_kv"),
            gguf_file::Value::U32(kv_heads as u32),
        ),
        (
            key("attention.layer_norm_rms_epsilon"),
            gguf_file::Value::F32(eps),
        ),
        (key("rope.freq_base"), gguf_file::Value::F32(theta)),
        // Qwen3's head dimension is not hidden / heads.
        (
            key("attention.key_length"),
            gguf_file::Value::U32(
                config["head_dim"]
                    .as_u64()
                    .map_or(get("hidden_size") / heads as u32, |d| d as u32),
            ),
        ),
        (key("vocab_size"), gguf_file::Value::U32(get("vocab_size"))),
    ];
    let md: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = quantized.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(out).expect("create gguf");
    gguf_file::write(&mut file, &md, &ts).expect("write gguf");
}

/// Not a check: writes the Q4_1 GGUF of the benchmark model in `TESSERA_BENCH_MODEL`
/// (a safetensors folder) next to it, for scripts/bench-gpu.
#[test]
#[ignore = "run by scripts/bench-gpu"]
fn write_q4_1_for_the_benchmarks() {
    let dir = std::path::PathBuf::from(
        std::env::var("TESSERA_BENCH_MODEL").expect("TESSERA_BENCH_MODEL"),
    );
    let out = dir.with_extension("q4_1.gguf");
    let started = std::time::Instant::now();
    write_gguf(&dir, GgmlDType::Q4_1, &out);
    println!(
        "wrote {} in {:.1}s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
}
