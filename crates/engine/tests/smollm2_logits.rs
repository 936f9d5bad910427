//! SmolLM2 (GGUF Q4_1) against Hugging Face `transformers`, which dequantizes the same file
//! to float32: last-position logits of every fixture prompt.

mod common;

use common::*;
use tessera_engine::{Engine, EngineConfig};

#[test]
fn last_position_logits_match_transformers() {
    let fixture = read_json(fixtures().join("smollm2/logits.json"));
    let mut engine = Engine::load(&EngineConfig::new(smollm2_path())).expect("load");
    let (mut worst, mut worst_llama) = (0f64, 0f64);
    for p in fixture["prompts"].as_array().expect("prompts") {
        let name = p["name"].as_str().expect("name");
        let prompt = ids(&p["prompt_ids"]);
        let want = read_f32(
            fixtures()
                .join("smollm2")
                .join(p["logits_file"].as_str().expect("file")),
        );
        let got = last_logits(&mut engine, &prompt);
        assert_eq!(got.len(), want.len());
        let err = rel_l2(&got, &want);
        let (t_got, t_want) = (top_k(&got, 5), top_k(&want, 5));
        let overlap = t_got.iter().filter(|t| t_want.contains(t)).count();
        let llama = read_f32(
            fixtures()
                .join("smollm2/llamacpp_logits")
                .join(format!("{name}.f32")),
        );
        let err_llama = rel_l2(&got, &llama);
        let (lp_err, lp_err_llama) = (
            top_logprob_error(&got, &want, 4),
            top_logprob_error(&llama, &want, 4),
        );
        worst = worst.max(lp_err);
        worst_llama = worst_llama.max(lp_err_llama);
        println!(
            "{name}: rel L2 {err:.4} (to llama.cpp {err_llama:.4}), top1 {} vs {}, top5 overlap \
             {overlap}, top-4 log-prob error {lp_err:.4} nats (llama.cpp {lp_err_llama:.4})",
            t_got[0], t_want[0]
        );
        // Bounds from the references themselves (tests/fixtures/models/README.md): Q4_1
        // matmuls quantize activations to Q8_1 and the rounding noise grows over 30
        // layers, so llama.cpp differs from transformers by up to 0.054 relative L2 at the
        // last position (0.114 at some earlier ones). Top-1 must agree wherever the
        // reference's best logit leads the next by more than 0.3.
        let ref_gap = want[t_want[0] as usize] - want[top_k(&want, 2)[1] as usize];
        if ref_gap > 0.3 {
            assert_eq!(
                t_got[0], t_want[0],
                "{name}: top-1 differs (reference margin {ref_gap})"
            );
        }
        assert!(overlap >= 3, "{name}: top-5 overlap {overlap}");
        assert!(
            err < 0.08,
            "{name}: relative L2 error {err} against transformers"
        );
        assert!(
            err_llama < 0.12,
            "{name}: relative L2 error {err_llama} against llama.cpp"
        );
    }
    // Log-probabilities of transformers' four most likely first tokens. The error of both
    // Tessera and llama.cpp comes from 8-bit activations in the quantized matmuls
    // (docs/fidelity.md; with every matmul in f32 Tessera matches transformers to 1e-4
    // nats), and which way each activation rounds is decided by the last bits of the
    // sums before it: changing only the order of f32 additions in the kernels moved
    // fibonacci's error from 0.206 to 0.386 nats while the mean over all 220 positions of
    // these prompts moved from 0.159 to 0.165 (llama.cpp 0.161). The worst of six is a
    // draw from that spread, so each prompt is held to the spread llama.cpp itself shows
    // on these prompts (its worst over their 220 positions), and the comparison of the
    // means is the test below.
    let positions = read_json(fixtures().join("smollm2/positions.json"));
    let prompts = positions["prompts"].as_array().expect("prompts");
    let llama_spread = PositionErrors::of(prompts, |p, i| floats(&p["llamacpp_logprobs"][i]));
    println!(
        "worst top-4 log-prob error {worst:.4} nats; llama.cpp's {worst_llama:.4} here, {:.4} \
         over the prompts' 220 positions",
        llama_spread.worst
    );
    assert!(
        worst <= llama_spread.worst,
        "worst top-4 log-prob error {worst} nats, llama.cpp's up to {} on these prompts",
        llama_spread.worst
    );
}

/// The same, at every position of the fixture prompts (220): the mean of the top-4
/// errors, a steadier measure than the worst of six. Measured: Tessera 0.159 nats,
/// llama.cpp 0.161; the allowance is for another SIMD width's summation order.
#[test]
fn logprobs_at_every_position_as_close_to_transformers_as_llama_cpp() {
    let fixture = read_json(fixtures().join("smollm2/positions.json"));
    let prompts = fixture["prompts"].as_array().expect("prompts");
    let llama = PositionErrors::of(prompts, |p, i| floats(&p["llamacpp_logprobs"][i]));
    let mut engine = Engine::load(&EngineConfig::new(smollm2_path())).expect("load");
    let got = PositionErrors::of_engine(prompts, &mut engine);
    println!("Tessera: {got}\nllama.cpp: {llama}");
    assert!(
        got.mean <= 1.05 * llama.mean,
        "mean top-4 log-prob error {} nats, llama.cpp's {}",
        got.mean,
        llama.mean
    );
}
