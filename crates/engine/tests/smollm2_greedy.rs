//! SmolLM2 (GGUF Q4_1) greedy continuations against llama.cpp, which runs the same
//! quantized arithmetic (Q8_1 activations for Q4_1 weights, Q8_0 for the Q8_0 head).

mod common;

use common::*;
use tessera_engine::{generate, Engine, EngineConfig, GenerateOptions};
use tessera_protocol::SamplingParams;

/// llama.cpp's own choice is a coin toss where its two best logits are within this much:
/// the rounding noise of quantized activations is larger. Tokens are compared up to the
/// first such step.
const NEAR_TIE: f32 = 0.1;

#[test]
fn greedy_tokens_match_llama_cpp() {
    let fixture = read_json(fixtures().join("smollm2/greedy.json"));
    let mut engine = Engine::load(&EngineConfig::new(smollm2_path())).expect("load");
    let mut report = Vec::new();
    for p in fixture["prompts"].as_array().expect("prompts") {
        let name = p["name"].as_str().expect("name");
        let prompt = ids(&p["prompt_ids"]);
        let want = ids(&p["output_ids"]);
        let gaps = floats(&p["output_top2_gaps"]);
        let firm = gaps.iter().take_while(|g| **g >= NEAR_TIE).count().min(24);
        let opts = GenerateOptions {
            max_tokens: 24,
            sampling: SamplingParams::greedy(),
            stop_token_ids: vec![],
            prefill_chunk: 0,
        };
        let got = generate(&mut engine, &prompt, &opts, |_| {}).expect("generate");
        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        println!("{name}: {agree} tokens agree with llama.cpp, {firm} before its first near tie");
        report.push((name.to_string(), agree, firm));
    }
    for (name, agree, firm) in &report {
        assert!(
            agree >= firm,
            "{name}: {agree} leading tokens agree with llama.cpp, {firm} expected"
        );
    }
    // Both chats are free of near ties: their whole answers (end of turn included) match.
    let chat_tokens: usize = report
        .iter()
        .filter(|r| r.0.starts_with("chat"))
        .map(|r| r.2)
        .sum();
    assert_eq!(chat_tokens, 8 + 21, "the chat fixtures changed");
}
