//! One server-shaped request, repeated, for profiling with `perf`: prefill a prompt of
//! `PROMPT` tokens, then decode `DECODE` tokens greedily; prints the prefill and decode
//! times of each repetition, then the fastest and the median of each.
//!
//! `cargo run --release -p tessera-engine --example request_profile -- [PROMPT] [DECODE] [REPEAT]`
//! (defaults 124, 64, 10; the model from scripts/fetch-model).

use std::time::Instant;

use tessera_engine::{generate, Engine, EngineConfig, GenerateOptions};
use tessera_protocol::SamplingParams;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (prompt_len, decode, repeat) = (arg(1, 124), arg(2, 64), arg(3, 10));
    let cfg = EngineConfig::new(tessera_engine::default_model_path());
    let mut engine = Engine::load(&cfg)?;
    let (mut prefills, mut decodes) = (Vec::new(), Vec::new());
    for r in 0..repeat {
        // A different prompt each time, so no prefix is reused.
        let prompt: Vec<u32> = (0..prompt_len)
            .map(|i| 200 + ((i * 37 + r * 101) % 9000) as u32)
            .collect();
        let opts = |max_tokens| GenerateOptions {
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop_token_ids: vec![],
            prefill_chunk: 0,
        };
        let start = Instant::now();
        generate(&mut engine, &prompt, &opts(1), |_| {})?;
        let prefill = start.elapsed().as_secs_f64();
        let start = Instant::now();
        generate(&mut engine, &prompt, &opts(decode + 1), |_| {})?;
        let total = start.elapsed().as_secs_f64();
        println!(
            "prefill {prompt_len} tokens {:.1} ms ({:.0} tok/s), decode {decode} tokens {:.1} ms ({:.1} tok/s)",
            prefill * 1e3,
            prompt_len as f64 / prefill,
            (total - prefill) * 1e3,
            decode as f64 / (total - prefill)
        );
        prefills.push(prompt_len as f64 / prefill);
        decodes.push(decode as f64 / (total - prefill));
    }
    for (name, mut v) in [("prefill", prefills), ("decode", decodes)] {
        v.sort_by(f64::total_cmp);
        if let (Some(best), Some(median)) = (v.last(), v.get(v.len() / 2)) {
            println!("{name}: best {best:.1} tok/s, median {median:.1} tok/s");
        }
    }
    Ok(())
}
