//! Dense Hugging Face folders (random tiny models written by transformers) against
//! transformers' own float32 logits: a sharded f32 llama with tied embeddings, a bf16
//! qwen2 with QKV bias and an untied head, and an f32 qwen3 with per-head query/key norms
//! (at TP = 1..4: 6 query heads and 2 KV heads split unevenly from TP = 4 on), also
//! from the same weights in a GGUF file; and an f32 gemma3 (sliding-window layers with
//! their own RoPE base, sandwich norms stored as `w - 1`, GELU MLP, scaled embeddings,
//! one KV head replicated under TP), from safetensors and GGUF; an f32 Qwen3-MoE (6
//! experts, top 2 renormalised, one dense layer between two mixtures), each expert split
//! along its intermediate dimension (40 columns: 13/14/13 at TP = 3); and an f32 Mixtral
//! (5 experts of 38 columns, top 2 renormalised, every layer a mixture: 13/13/12 at
//! TP = 3, 10/10/9/9 at TP = 4). Both mixtures also from GGUF, where llama.cpp stores
//! the experts as 3-D `ffn_*_exps` tensors. An f32 Mistral whose every layer attends to
//! its last 8 positions (`sliding_window`, as in Mistral 7B v0.1). An f32 Phi-3 whose
//! query/key/value and gate/up projections are fused, from safetensors and GGUF. An f32
//! SmolLM3 whose fourth layer adds no position embedding, from safetensors and GGUF. An
//! f32 Gemma 2 (a window in every other layer, capped attention scores and logits). An
//! f32 Granite (its embedding, attention, residual and logit scalars), from safetensors
//! and GGUF. An f32 GLM-4 (half of each head rotated in neighbouring pairs, biases, a
//! fused gate/up projection, norms after attention and the MLP), from safetensors and GGUF.
//! An f32 OLMo 2 (no input norms; query/key norms across heads, all-reduced under TP).

mod common;

use common::*;

fn check(model: &str, tp: usize, tolerance: f32) {
    check_against_transformers(model, &fixtures().join(model), tp, tolerance);
}

/// f32 weights and f32 arithmetic: agreement near float32 rounding.
#[test]
fn tiny_llama_sharded_f32_matches_transformers() {
    check("tiny-llama", 1, 1e-5);
}

/// bf16 weights are exact in f32, so the bound is the same.
#[test]
fn tiny_qwen2_bf16_matches_transformers() {
    check("tiny-qwen2", 1, 1e-5);
}

/// Per-head q/k RMSNorm, head_dim unlike hidden / heads, tied head; every TP size, with the
/// heads split unevenly (and KV heads replicated) at 4 ranks.
#[test]
fn tiny_qwen3_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-qwen3", tp, 1e-5);
    }
}

/// The same weights as a GGUF file laid out as llama.cpp lays out qwen3 (f32 tensors).
#[test]
fn tiny_qwen3_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-qwen3.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-qwen3", &path, tp, 1e-5);
    }
}

/// Gemma 3: a window of 8 positions in five of six layers (the 20- and 60-token prompts
/// reach past it), one KV head for 4 query heads (TP = 3 splits them 2/1/1).
#[test]
fn tiny_gemma3_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-gemma3", tp, 1e-5);
    }
}

/// The same weights as llama.cpp writes gemma3 (norms with the 1 added, every sixth layer
/// global).
#[test]
fn tiny_gemma3_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-gemma3.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-gemma3", &path, tp, 1e-5);
    }
}

/// Qwen3-MoE: routed experts grouped by token, each rank summing its slice of every expert
/// before the layer's one all-reduce; every TP size, the expert columns split unevenly at
/// TP = 3 and the query heads at TP = 3 and 4.
#[test]
fn tiny_qwen3_moe_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-qwen3-moe", tp, 1e-4);
    }
}

/// The same weights as a qwen3moe GGUF file: each expert read as its slice of the 3-D
/// `ffn_{gate,up,down}_exps` tensors, the router from `ffn_gate_inp`, the dense layer
/// found by its having no router.
#[test]
fn tiny_qwen3_moe_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-qwen3-moe.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-qwen3-moe", &path, tp, 1e-4);
    }
}

/// Mixtral from its checkpoint names (`block_sparse_moe.experts.E.w1/w3/w2`): softmax over
/// all experts, top 2 renormalised; the expert columns split unevenly at TP = 3 and 4 and
/// the query heads at TP = 3.
#[test]
fn tiny_mixtral_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-mixtral", tp, 1e-4);
    }
}

/// The same weights as llama.cpp converts Mixtral: architecture `llama` (query and key
/// rows permuted for its interleaved RoPE), experts stacked into 3-D tensors, the experts'
/// width from `llama.feed_forward_length`.
#[test]
fn tiny_mixtral_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-mixtral.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-mixtral", &path, tp, 1e-4);
    }
}

/// The same weights as older Mixtral GGUF files hold them: one 2-D tensor per expert
/// (`blk.N.ffn_gate.E.weight`) instead of the stacked 3-D tensors.
#[test]
fn tiny_mixtral_gguf_with_one_tensor_per_expert_matches_transformers() {
    let path = fixtures().join("tiny-mixtral-split-experts.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-mixtral", &path, tp, 1e-4);
    }
}

/// Mistral with `sliding_window` 8 in every layer: the 20- and 60-token prompts reach past
/// it (transformers' logits move by 0.83 relative L2 without the window). The prompt runs
/// in chunks of 7 during greedy decoding, so the window also crosses chunk and block
/// boundaries in the paged cache.
#[test]
fn tiny_mistral_sliding_window_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-mistral", tp, 1e-5);
    }
}

/// Phi-3 (and Phi-4): query, key and value rows fused in `qkv_proj`, gate and up rows in
/// `gate_up_proj`, each part split over the ranks on its own (96 columns: 24 each at
/// TP = 4; 4 query heads over 2 KV heads, replicated at TP = 3 and 4).
#[test]
fn tiny_phi3_fused_projections_match_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-phi3", tp, 1e-5);
    }
}

/// The same weights as llama.cpp writes phi3: `attn_qkv`, and `ffn_up` twice as tall.
#[test]
fn tiny_phi3_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-phi3.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-phi3", &path, tp, 1e-5);
    }
}

/// A fused tensor of the wrong height is refused by its own name, with both shapes.
#[test]
fn a_fused_projection_of_the_wrong_height_is_refused_by_name() {
    let dir = edited_copy("tiny-phi3", |c| {
        c["intermediate_size"] = serde_json::json!(80)
    });
    let err =
        tessera_engine::Engine::load(&tessera_engine::EngineConfig::new(&dir.0).with_cpu_ranks(1))
            .err()
            .expect("refused")
            .to_string();
    assert!(
        err.contains("model.layers.0.mlp.gate_up_proj.weight")
            && err.contains("160")
            && err.contains("192"),
        "{err}"
    );
}

/// SmolLM3: layer 3 of 5 rotates neither queries nor keys (`no_rope_layers`).
#[test]
fn tiny_smollm3_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-smollm3", tp, 1e-5);
    }
}

/// The same weights as llama.cpp writes smollm3 (rows permuted as for llama; every
/// fourth layer without RoPE, which the file does not state).
#[test]
fn tiny_smollm3_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-smollm3.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-smollm3", &path, tp, 1e-5);
    }
}

/// Rotating every layer instead moves the 60-token case far from the reference.
#[test]
fn tiny_smollm3_reference_depends_on_the_layer_without_rope() {
    let dir = edited_copy("tiny-smollm3", |c| {
        c["no_rope_layers"] = serde_json::json!([1, 1, 1, 1, 1])
    });
    let err = long_case_error("tiny-smollm3", &dir.0);
    println!("tiny-smollm3 with every layer rotating: rel L2 {err:.2e}");
    assert!(err > 1e-2, "{err}");
}

/// Gemma 2: a window of 8 in layers 0 and 2, scores capped at 2, logits capped at 8; 2
/// KV heads for 4 query heads (replicated at TP = 3 and 4).
#[test]
fn tiny_gemma2_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-gemma2", tp, 1e-5);
    }
}

/// The same weights as llama.cpp writes gemma2 (norms with the 1 added, both caps and the
/// window in the metadata, every other layer global).
#[test]
fn tiny_gemma2_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-gemma2.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-gemma2", &path, tp, 1e-5);
    }
}

/// Without either cap the 60-token case is far from the reference.
#[test]
fn tiny_gemma2_reference_depends_on_both_caps() {
    for cap in ["attn_logit_softcapping", "final_logit_softcapping"] {
        let dir = edited_copy("tiny-gemma2", |c| c[cap] = serde_json::Value::Null);
        let err = long_case_error("tiny-gemma2", &dir.0);
        println!("tiny-gemma2 without {cap}: rel L2 {err:.2e}");
        assert!(err > 1e-2, "{cap}: {err}");
    }
}

/// Granite: embeddings times 2, scores times 1/32, each layer half's output times 0.5
/// before the residual add, logits divided by 4; 2 KV heads for 4 query heads.
#[test]
fn tiny_granite_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-granite", tp, 1e-5);
    }
}

/// The same weights as llama.cpp writes granite (query/key rows permuted as llama's, the
/// four scalars in the metadata).
#[test]
fn tiny_granite_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-granite.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-granite", &path, tp, 1e-5);
    }
}

/// Each of the four scalars at transformers' default of 1 moves the 60-token case far
/// from the reference.
#[test]
fn tiny_granite_reference_depends_on_each_scalar() {
    for scalar in [
        "embedding_multiplier",
        "attention_multiplier",
        "residual_multiplier",
        "logits_scaling",
    ] {
        let dir = edited_copy("tiny-granite", |c| c[scalar] = 1.0.into());
        let err = long_case_error("tiny-granite", &dir.0);
        println!("tiny-granite with {scalar} 1: rel L2 {err:.2e}");
        assert!(err > 1e-2, "{scalar}: {err}");
    }
}

/// GLM-4: half of each head rotates, in neighbouring pairs; query/key/value biases; a
/// fused gate/up projection; norms after attention and after the MLP.
#[test]
fn tiny_glm4_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-glm4", tp, 1e-5);
    }
}

/// The same weights as llama.cpp writes glm4 (rows as trained, the rotated part as
/// `glm4.rope.dimension_count`, the fused gate/up rows as one `ffn_up`).
#[test]
fn tiny_glm4_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-glm4.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-glm4", &path, tp, 1e-5);
    }
}

/// Rotating whole heads moves the 60-token case far from the reference.
#[test]
fn tiny_glm4_reference_depends_on_the_partial_rotation() {
    let dir = edited_copy("tiny-glm4", |c| {
        c["rope_parameters"]["partial_rotary_factor"] = 1.0.into()
    });
    let err = long_case_error("tiny-glm4", &dir.0);
    println!("tiny-glm4 rotating whole heads: rel L2 {err:.2e}");
    assert!(err > 1e-2, "{err}");
}

/// OLMo 2: no input norms, norms after attention and the MLP, and query and key norms
/// across all heads, whose sums of squares are all-reduced over the ranks that split the
/// heads (2 KV heads replicated at TP = 3 and 4 count once each).
#[test]
fn tiny_olmo2_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-olmo2", tp, 1e-5);
    }
}

/// The same weights as llama.cpp writes olmo2.
#[test]
fn tiny_olmo2_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-olmo2.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-olmo2", &path, tp, 1e-5);
    }
}

/// OLMo 3: OLMo 2's layer with a window of 8 in three layers of four, and YaRN (factor
/// 4) on the full-attention layer only, the sliding ones rotating plainly with the same
/// base (transformers 5's per-layer-type `rope_parameters`).
#[test]
fn tiny_olmo3_matches_transformers_at_every_tp_size() {
    for tp in 1..=4 {
        check("tiny-olmo3", tp, 1e-5);
    }
}

/// The same weights as llama.cpp's converter writes OLMo 3: architecture olmo2 with
/// `attention.sliding_window` and its per-layer pattern, and YaRN's keys, which the full
/// layer alone applies.
#[test]
fn tiny_olmo3_gguf_matches_transformers_at_every_tp_size() {
    let path = fixtures().join("tiny-olmo3.gguf");
    for tp in 1..=4 {
        check_against_transformers("tiny-olmo3", &path, tp, 1e-5);
    }
}

/// The reference depends on the window and on the full layer's YaRN: without either the
/// 60-token case moves far.
#[test]
fn tiny_olmo3_reference_depends_on_the_window_and_the_full_layers_yarn() {
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let edits: [(&str, Edit); 2] = [
        ("no window", Box::new(|c| c["sliding_window"] = 512.into())),
        (
            "plain RoPE in the full layer",
            Box::new(|c| {
                c["rope_parameters"]["full_attention"] =
                    serde_json::json!({"rope_type": "default", "rope_theta": 500000.0})
            }),
        ),
    ];
    for (what, edit) in edits {
        let dir = edited_copy("tiny-olmo3", edit);
        let err = long_case_error("tiny-olmo3", &dir.0);
        println!("tiny-olmo3 with {what}: rel L2 {err:.2e}");
        assert!(err > 5e-2, "{what}: {err}");
    }
}
