//! Writes a Hugging Face llama, qwen2 or qwen3 folder (config.json + safetensors) as a GGUF file
//! with its matrices quantized (Q4_1, Q8_0), the way llama.cpp's converter lays it out:
//! GGUF tensor names, llama's query and key rows permuted for interleaved RoPE, norms
//! and biases in f32. With `Vocab::Embedded` the folder's byte-level BPE tokenizer goes
//! into the file too, as llama.cpp's converter writes it, so that llama.cpp's own server
//! can load the same file (scripts/bench-gpu's peer rows).
#![allow(dead_code)] // each test crate that includes this file uses a part of it

use std::collections::HashMap;
use std::path::{Path, PathBuf};

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

/// Whether the file carries the tokenizer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Vocab {
    /// Weights and hyper-parameters only: Tessera takes the folder's tokenizer.
    Omitted,
    /// `tokenizer.ggml.*` from the folder's `tokenizer.json` (byte-level BPE).
    Embedded,
}

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// The `tokenizer.ggml.*` entries of a byte-level BPE `tokenizer.json`: tokens in id
/// order, merges, special tokens as control tokens and every other added token as a
/// user-defined one (matched whole in text, as transformers does), and GPT-2's split
/// rules (the folder's pre-tokenizer must be `ByteLevel` with its regex).
fn tokenizer_metadata(dir: &Path, config: &Json) -> Vec<(String, gguf_file::Value)> {
    use gguf_file::Value;
    let tok: Json = serde_json::from_str(
        &std::fs::read_to_string(dir.join("tokenizer.json")).expect("tokenizer.json"),
    )
    .expect("tokenizer json");
    let model = &tok["model"];
    assert_eq!(
        model["type"], "BPE",
        "only byte-level BPE tokenizers are written"
    );
    // GGUF names the split rules; "gpt-2" is ByteLevel's own regex, nothing else is mapped.
    let pre = &tok["pre_tokenizer"];
    assert!(
        pre["type"] == "ByteLevel" && pre["use_regex"] != false,
        "only a lone ByteLevel pre-tokenizer is written, not {pre}"
    );
    let mut by_id: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: usize, text: &str, kind: i32| {
        if by_id.len() <= id {
            by_id.resize(id + 1, None);
        }
        by_id[id] = Some((text.to_string(), kind));
    };
    for (text, id) in model["vocab"].as_object().expect("model.vocab") {
        put(id.as_u64().expect("vocab id") as usize, text, NORMAL);
    }
    for added in tok["added_tokens"].as_array().into_iter().flatten() {
        let kind = if added["special"].as_bool() == Some(true) {
            CONTROL
        } else {
            USER_DEFINED
        };
        put(
            added["id"].as_u64().expect("added id") as usize,
            added["content"].as_str().expect("added content"),
            kind,
        );
    }
    let (tokens, types): (Vec<Value>, Vec<Value>) = by_id
        .into_iter()
        .enumerate()
        .map(|(id, entry)| {
            let (text, kind) = entry.unwrap_or_else(|| panic!("no token has id {id}"));
            (Value::String(text), Value::I32(kind))
        })
        .unzip();
    // tokenizers writes merges as "a b" strings or, since 0.20, as [a, b] pairs.
    let merges: Vec<Value> = model["merges"]
        .as_array()
        .expect("model.merges")
        .iter()
        .map(|m| match m {
            Json::String(s) => Value::String(s.clone()),
            Json::Array(pair) => Value::String(format!(
                "{} {}",
                pair[0].as_str().expect("merge"),
                pair[1].as_str().expect("merge")
            )),
            other => panic!("merge {other}"),
        })
        .collect();
    let eos = config["eos_token_id"].as_u64().expect("eos_token_id") as u32;
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("gpt-2".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ]
}

/// The types of a file's matrices: one type for every matrix, or llama.cpp's Q4_K_M mix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GgufTypes {
    All(GgmlDType),
    /// Q4_K, with Q6_K for the output matrix and for `attn_v` and `ffn_down` in the layers
    /// llama.cpp's `use_more_bits` picks (the first and last eighth, every third between);
    /// a matrix whose rows are no whole number of 256-weight super-blocks falls back as
    /// llama.cpp's does (Q4_K to Q5_0, Q6_K to Q8_0).
    Q4KM,
}

impl From<GgmlDType> for GgufTypes {
    fn from(d: GgmlDType) -> Self {
        GgufTypes::All(d)
    }
}

impl GgufTypes {
    /// The type of matrix `name` (a GGUF tensor name) of `cols` columns in a model of
    /// `layers` layers.
    fn of(self, name: &str, cols: usize, layers: usize, tied: bool) -> GgmlDType {
        match self {
            GgufTypes::All(d) => d,
            GgufTypes::Q4KM => q4_k_m_type(name, cols, layers, tied),
        }
    }
}

/// The type of a matrix in a Q4_K_M file (see [`GgufTypes::Q4KM`]); a tied model's
/// embedding table is its output matrix.
fn q4_k_m_type(name: &str, cols: usize, layers: usize, tied: bool) -> GgmlDType {
    let layer = name
        .strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|i| i.parse::<usize>().ok());
    let more_bits = |i: usize| i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2;
    let six = name == "output.weight"
        || (tied && name == "token_embd.weight")
        || ((name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight"))
            && layer.is_some_and(more_bits));
    match (six, cols.is_multiple_of(256)) {
        (true, true) => GgmlDType::Q6K,
        (true, false) => GgmlDType::Q8_0,
        (false, true) => GgmlDType::Q4K,
        (false, false) => GgmlDType::Q5_0,
    }
}

pub fn write_gguf(dir: &Path, types: impl Into<GgufTypes>, vocab: Vocab, out: &Path) {
    let types = types.into();
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
    let layers = get("num_hidden_layers") as usize;
    let tied = !tensors.contains_key("lm_head.weight");
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
                QTensor::quantize(&t, types.of(&name, t.dims()[1], layers, tied))
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
    let mut metadata = metadata;
    if vocab == Vocab::Embedded {
        metadata.extend(tokenizer_metadata(dir, &config));
    }
    let md: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = quantized.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(out).expect("create gguf");
    gguf_file::write(&mut file, &md, &ts).expect("write gguf");
}

/// The models of the GPU checks (`scripts/gpu/make_models.py`) this writer can write.
/// It knows neither Gemma 3's layout (norms stored with 1 added, its window) nor stacked
/// experts: those are checked from their safetensors folders only.
pub const GGUF_CHECK_MODELS: [&str; 4] = ["llama", "qwen2", "mistral", "qwen3"];

/// The models the GPU checks run in bf16 only (besides those above).
pub const BF16_CHECK_MODELS: [&str; 13] = [
    "qwen3-moe",
    "gemma3",
    "phi3",
    "smollm3",
    "gemma2",
    "phi4-mini",
    "granite",
    "glm4",
    "olmo2",
    "gpt-oss",
    "glm4-moe",
    "olmo3",
    "minimax-m2",
];

/// The models the GPU checks run with MXFP4 experts (served as Q5_0), from their
/// safetensors folders.
pub const MXFP4_CHECK_MODELS: [&str; 1] = ["gpt-oss-mxfp4"];

/// The GGUF formats the GPU checks run.
pub const GGUF_CHECK_FORMATS: [(GgufTypes, &str); 3] = [
    (GgufTypes::All(GgmlDType::Q4_1), "q4_1"),
    (GgufTypes::All(GgmlDType::Q8_0), "q8_0"),
    (GgufTypes::Q4KM, "q4_k_m"),
];

/// The GPU checks' GGUF file of the model folder `folder` in `types` (`NAME-TAG.gguf`
/// beside the folder), written the first time it is asked for.
pub fn check_gguf(folder: &Path, types: impl Into<GgufTypes>, tag: &str) -> PathBuf {
    let name = folder
        .file_name()
        .and_then(|n| n.to_str())
        .expect("model folder name");
    let file = folder.with_file_name(format!("{name}-{tag}.gguf"));
    if !file.exists() {
        write_gguf(folder, types, Vocab::Omitted, &file);
    }
    file
}
