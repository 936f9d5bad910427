//! SmolLM2 (GGUF Q4_1) against Hugging Face `transformers`, which dequantizes the same file
//! to float32: last-position logits of every fixture prompt.

mod common;

use common::*;
use tessera_engine::model::Batch;
use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::{ScheduledChunk, SeqId, StepPlan};

/// Last-position logits of `prompt` on a fresh engine.
pub fn last_logits(engine: &mut Engine, prompt: &[u32]) -> Vec<f32> {
    let plan = StepPlan {
        new_sequences: vec![],
        scheduled: vec![ScheduledChunk {
            id: SeqId(1),
            tokens: prompt.to_vec(),
            start_pos: 0,
            block_table: (0..prompt.len().div_ceil(16) as u32).collect(),
            sample: true,
        }],
        finished: vec![],
    };
    let batch = Batch::from_plan(&plan, 16, 1024, 8192).expect("batch");
    engine.forward(batch).expect("forward")
}

#[test]
fn last_position_logits_match_transformers() {
    let fixture = read_json(fixtures().join("smollm2/logits.json"));
    let mut engine = Engine::load(&EngineConfig::new(smollm2_path())).expect("load");
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
        println!(
            "{name}: rel L2 {err:.4} (llama.cpp {err_llama:.4}), top1 {} vs {}, top5 overlap {overlap}",
            t_got[0], t_want[0]
        );
        // Top-1 equal, unless the reference itself has a near tie (its two best within 0.1)
        // and the choice agrees with llama.cpp's quantized arithmetic.
        let gap = want[t_want[0] as usize] - want[t_got[0] as usize];
        assert!(
            t_got[0] == t_want[0] || (gap < 0.1 && t_got[0] == top_k(&llama, 1)[0]),
            "{name}: top-1 {} vs reference {} (gap {gap})",
            t_got[0],
            t_want[0]
        );
        assert!(overlap >= 4, "{name}: top-5 overlap {overlap}");
        assert!(err < 0.05, "{name}: relative L2 error {err}");
    }
}
