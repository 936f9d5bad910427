//! The test GGUF writer (`tests/common/gguf_writer.rs`) that the GPU checks and
//! `scripts/bench-gpu` use: a file it writes from a safetensors folder is the same model.
//! - Its tokenizer (a byte-level BPE trained here, with special and plain added tokens,
//!   as `scripts/gpu/make_bench_models.py` makes) encodes and decodes as the folder's
//!   `tokenizer.json` does, through Tessera's GGUF tokenizer.
//! - Its weights (random models of tiny-llama's, tiny-qwen2's and tiny-qwen3's
//!   architectures, in Q8_0; llama's query and key rows permuted for interleaved RoPE)
//!   give the folder's logits within Q8_0's rounding: a wrong permutation, name or
//!   metadata moves them by far more.
//! - Float files (bf16, f16) give the folder's logits to the bit, or within f16's
//!   rounding: the loader keeps their type until a device takes each shard.

mod common;
#[path = "common/gguf_writer.rs"]
mod gguf_writer;

use std::path::Path;

use candle_core::quantized::GgmlDType;
use common::*;
use gguf_writer::{write_gguf, Vocab};
use tessera_engine::loader::load_tokenizer;
use tessera_engine::{test_models, Engine, EngineConfig};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, NormalizerWrapper, PostProcessorWrapper, TokenizerBuilder};

const CORPUS: &str = "The quick brown fox jumps over the lazy dog. Tensor parallel ranks \
    share the weights of every layer; the paged cache holds keys and values in blocks. \
    Paris, Rome and Madrid are capitals; 1234 + 5678 = 6912. The river runs to the sea.";

/// Q8_0 rounds every weight, and the engine every matmul's activations, to 8 bits: the
/// logits move by 1.6e-2 to 2.7e-2 relative L2 on these models. Leaving llama's query and
/// key rows unpermuted moves them by 0.8.
const Q8_LOGITS_BOUND: f32 = 5e-2;

/// A byte-level BPE of `specials + trained merges`, padded with plain added tokens to
/// `vocab` entries, saved as `dir/tokenizer.json`.
fn write_tokenizer(dir: &Path, vocab: usize) {
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab - 40)
        .special_tokens(
            specials
                .iter()
                .map(|s| AddedToken::from(*s, true))
                .collect(),
        )
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .show_progress(false)
        .build();
    let mut tok = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        ByteLevel,
        PostProcessorWrapper,
        ByteLevel,
    >::new()
    .with_model(BPE::default())
    .with_normalizer(None)
    .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
    .with_post_processor(None)
    .with_decoder(Some(ByteLevel::default()))
    .build()
    .expect("tokenizer");
    tok.train(&mut trainer, std::iter::repeat_n(CORPUS, 8))
        .expect("train");
    let base = tok.get_vocab_size(true);
    let padding: Vec<AddedToken> = (base..vocab)
        .map(|i| AddedToken::from(format!("<|t{i}|>"), false))
        .collect();
    tok.add_tokens(padding).expect("add tokens");
    assert_eq!(tok.get_vocab_size(true), vocab);
    tok.save(dir.join("tokenizer.json"), false)
        .expect("save tokenizer");
}

/// A random bf16 model of a tiny fixture's architecture in dimensions that Q8_0's blocks
/// of 32 divide (`test_models`), with a trained tokenizer and its end-of-sequence id set
/// to the tokenizer's `<|im_end|>`.
fn model_with_tokenizer(fixture: &str, out: &Path) {
    let dims = test_models::gpu_shaped(fixture).expect("dims");
    test_models::write(&fixtures().join(fixture), out, &dims, 7).expect("write model");
    let mut config = read_json(out.join("config.json"));
    let vocab = config["vocab_size"].as_u64().expect("vocab_size") as usize;
    write_tokenizer(out, vocab);
    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).expect("load");
    config["eos_token_id"] = tok.token_to_id("<|im_end|>").expect("im_end").into();
    config["bos_token_id"] = serde_json::Value::Null;
    std::fs::write(out.join("config.json"), config.to_string()).expect("config");
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tessera-gguf-writer-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn the_embedded_tokenizer_encodes_and_decodes_as_the_folders() {
    let dir = scratch("tokenizer");
    model_with_tokenizer("tiny-llama", &dir);
    let gguf = dir.with_extension("gguf");
    write_gguf(&dir, GgmlDType::Q8_0, Vocab::Embedded, &gguf);
    let theirs = load_tokenizer(&dir).expect("folder tokenizer");
    let ours = load_tokenizer(&gguf).expect("gguf tokenizer");
    assert_eq!(ours.vocab_size(), theirs.vocab_size());
    let texts = [
        "The quick brown fox",
        "tensor ranks share the paged cache's blocks",
        "  two spaces, then 1234567 digits and émoji 🚀",
        "<|im_start|>user\nhello<|im_end|>",
        "a plain added token: <|t500|> and text around it",
    ];
    for text in texts {
        let want = theirs.encode(text, false).expect("encode");
        let got = ours.encode(text, false).expect("encode");
        assert_eq!(got, want, "{text:?}");
        assert_eq!(
            ours.decode(&got, false).expect("decode"),
            theirs.decode(&want, false).expect("decode"),
            "{text:?}"
        );
    }
    let end = theirs.token_to_id("<|im_end|>").expect("im_end");
    assert!(
        ours.eos_token_ids().contains(&end),
        "{:?}",
        ours.eos_token_ids()
    );
    assert!(ours.is_special(end));
    assert!(!ours.is_special(theirs.token_to_id("<|t500|>").expect("t500")));
    assert_eq!(ours.bos_token_id(), None, "the folder has none");
    assert_eq!(
        ours.encode("no beginning token", true).expect("encode"),
        theirs.encode("no beginning token", false).expect("encode"),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&gguf);
}

#[test]
fn the_written_weights_are_the_folders_model() {
    for fixture in ["tiny-llama", "tiny-qwen2", "tiny-qwen3"] {
        let dir = scratch(fixture);
        model_with_tokenizer(fixture, &dir);
        let gguf = dir.with_extension("gguf");
        write_gguf(&dir, GgmlDType::Q8_0, Vocab::Embedded, &gguf);
        let mut dense = Engine::load(&EngineConfig::new(dir.clone())).expect("load folder");
        let mut quantized = Engine::load(&EngineConfig::new(gguf.clone())).expect("load gguf");
        let prompts: [&[u32]; 3] = [&[5, 17, 200, 33, 9], &[300; 12], &[1, 2, 3, 4, 5, 6, 7, 8]];
        for prompt in prompts {
            let want = last_logits(&mut dense, prompt);
            let got = last_logits(&mut quantized, prompt);
            let err = rel_l2(&got, &want);
            println!("{fixture} {prompt:?}: logits relative L2 {err:.2e}");
            assert!(err < Q8_LOGITS_BOUND, "{fixture}: {err} against the folder");
        }
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(&gguf);
    }
}

/// Float GGUF files load as the folder does: a bf16 file of the bf16 qwen2 folder holds
/// the same values, so its logits are the folder's to the last bit; an f16 file of the
/// f32 llama folder rounds each weight once (its dense weights and embedding stay f16
/// until placed).
#[test]
fn float_gguf_files_are_the_folders_model() {
    for (fixture, dtype, bound) in [
        ("tiny-qwen2", GgmlDType::BF16, 0.0),
        ("tiny-llama", GgmlDType::F16, 1e-5),
    ] {
        let dir = scratch(&format!("{fixture}-{dtype:?}"));
        model_with_tokenizer(fixture, &dir);
        let gguf = dir.with_extension("gguf");
        write_gguf(&dir, dtype, Vocab::Embedded, &gguf);
        let mut folder = Engine::load(&EngineConfig::new(dir.clone())).expect("load folder");
        let mut file = Engine::load(&EngineConfig::new(gguf.clone())).expect("load gguf");
        for prompt in [&[5u32, 17, 200, 33, 9][..], &[300; 12]] {
            let want = last_logits(&mut folder, prompt);
            let got = last_logits(&mut file, prompt);
            let err = rel_l2(&got, &want);
            println!("{fixture} {dtype:?} {prompt:?}: logits relative L2 {err:.2e}");
            assert!(
                err <= bound,
                "{fixture} {dtype:?}: {err} against the folder"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(&gguf);
    }
}
