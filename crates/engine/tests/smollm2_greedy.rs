//! SmolLM2 (GGUF Q4_1) greedy continuations against llama.cpp, which runs the same
//! quantized arithmetic (Q8_1 activations for Q4_1 weights).

mod common;

use common::*;
use tessera_engine::{generate, Engine, EngineConfig, GenerateOptions};
use tessera_protocol::SamplingParams;

#[test]
fn greedy_tokens_match_llama_cpp() {
    let fixture = read_json(fixtures().join("smollm2/greedy.json"));
    let mut engine = Engine::load(&EngineConfig::new(smollm2_path())).expect("load");
    let mut report = Vec::new();
    for p in fixture["prompts"].as_array().expect("prompts") {
        let name = p["name"].as_str().expect("name");
        let prompt = ids(&p["prompt_ids"]);
        let want = ids(&p["output_ids"]);
        let opts = GenerateOptions {
            max_tokens: 24,
            sampling: SamplingParams::greedy(),
            stop_token_ids: vec![],
            prefill_chunk: 0,
        };
        let got = generate(&mut engine, &prompt, &opts, |_| {}).expect("generate");
        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        println!(
            "{name}: {agree}/24 tokens agree with llama.cpp\n  got  {got:?}\n  want {:?}",
            &want[..24.min(want.len())]
        );
        report.push((name.to_string(), agree));
    }
    for (name, agree) in report {
        assert!(
            agree >= 24,
            "{name}: only {agree} leading tokens agree with llama.cpp"
        );
    }
}
