//! Gemma 2 (`Gemma2ForCausalLM`; GGUF `gemma2`), and the layer Gemma 3 builds on: RMSNorms
//! also after attention and after the MLP (checkpoints store each norm's weight less 1;
//! GGUF files with the 1 added), √hidden-scaled embeddings, a GELU (tanh) MLP, whole heads
//! rotating, and a window in a fixed pattern of layers. Gemma 2 alternates a windowed
//! layer with a global one, every layer at one RoPE base, and caps its attention scores
//! and final logits (transformers' and llama.cpp's defaults: 50 and 30).

use crate::error::{EngineError, Result};
use crate::families::gguf_metadata::Gguf;
use crate::families::hf_config::HfConfig;
use crate::families::row::{HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{Activation, ModelConfig, RopeStyle, SlidingWindow};
use crate::spec::rope::RopeScaling;

/// Gemma's layer on llama's.
pub(super) const LAYER: Layer = Layer {
    sandwich_norms: true,
    activation: Activation::GeluTanh,
    partial_rotation: false,
    ..Layer::LLAMA
};

/// Gemma's norms in GGUF files: its `post_attention_layernorm` is the norm after
/// attention, not the MLP's input norm that llama's name means.
pub(super) const TENSORS: TensorNames = TensorNames {
    gguf_renames: &[
        (
            "post_attention_layernorm.weight",
            "post_attention_norm.weight",
        ),
        ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
    ],
    ..TensorNames::LLAMA
};

static GEMMA2: Family = Family {
    name: "gemma2",
    hf_names: &["gemma2", "Gemma2ForCausalLM"],
    gguf_names: &["gemma2"],
    tensors: TENSORS,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &GEMMA2,
    layer: LAYER,
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults {
        tie_word_embeddings: true,
        ..HfDefaults::LLAMA
    },
    gguf_experts: None,
    from_hf,
    from_gguf,
    fixture: "tiny-gemma2",
};

/// Gemma 2 alternates a sliding-window layer with a global one.
const GLOBAL_EVERY: usize = 2;

/// Its caps where a config.json leaves them out (`null`: none).
const HF_CAPS: [f64; 2] = [50.0, 30.0];

/// llama.cpp's caps where a file leaves them out.
const GGUF_CAPS: [f32; 2] = [50.0, 30.0];

fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    let caps = hf_caps(hf, "gemma2", Some(HF_CAPS))?;
    check(hf)?;
    let full = (config.rope_theta, config.rope_scaling.clone());
    let [full, sliding] = hf.layer_type_ropes("gemma2", [full.clone(), full])?;
    let window = hf_window(hf, "gemma2", sliding, GLOBAL_EVERY)?;
    hf_layers(hf, config, full, window, caps);
    Ok(())
}

/// Every other layer global, all at the file's base, with the caps the file states.
fn from_gguf(gguf: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    let window = gguf.usize("attention.sliding_window")?;
    for (k, default, slot) in [
        (
            "attn_logit_softcapping",
            GGUF_CAPS[0],
            &mut config.attn_logit_softcapping,
        ),
        (
            "final_logit_softcapping",
            GGUF_CAPS[1],
            &mut config.final_logit_softcapping,
        ),
    ] {
        let cap = gguf.f32_opt(k)?.unwrap_or(default);
        *slot = (cap != 0.0).then_some(cap);
    }
    scale_27b_scores(config, 46);
    let sliding = SlidingWindow {
        window,
        layers: sliding_layers(config.num_layers, GLOBAL_EVERY),
        rope_theta: config.rope_theta,
        rope_scaling: config.rope_scaling.clone(),
    };
    gemma_layers(config, sliding);
    Ok(())
}

/// Which of `layers` layers slide when every `global_every`-th layer is global.
pub(super) fn sliding_layers(layers: usize, global_every: usize) -> Vec<bool> {
    (0..layers)
        .map(|i| global_every != 0 && (i + 1) % global_every != 0)
        .collect()
}

/// What both Gemmas add to the layer in both formats: √hidden-scaled embeddings and
/// `sliding` for the window layers.
pub(super) fn gemma_layers(config: &mut ModelConfig, sliding: SlidingWindow) {
    config.embed_scale = Some((config.hidden_size as f32).sqrt());
    config.sliding_window = Some(sliding);
}

/// llama.cpp knows the 27B models by their layer count (`layers_27b`) and scales their
/// scores by 1/√(hidden / heads), their query_pre_attn_scalar, instead of 1/√head_dim.
pub(super) fn scale_27b_scores(config: &mut ModelConfig, layers_27b: usize) {
    if config.num_layers == layers_27b {
        config.attention_scale =
            Some(1.0 / ((config.hidden_size / config.num_heads.max(1)) as f32).sqrt());
    }
}

/// A Gemma config.json's settings that Tessera's layer cannot honour.
pub(super) fn check(hf: &HfConfig) -> Result<()> {
    let unsupported =
        |what: String| Err(EngineError::Config(format!("{what} is not supported yet")));
    if hf.use_bidirectional_attention == Some(true) {
        return unsupported("use_bidirectional_attention".into());
    }
    if let Some(act) = hf
        .hidden_activation
        .as_deref()
        .filter(|a| *a != "gelu_pytorch_tanh")
    {
        return unsupported(format!("hidden_activation '{act}'"));
    }
    Ok(())
}

/// The caps on attention scores and final logits of `family`: `defaults` where the keys
/// are absent (`null`: no cap), or (`None`) none, a cap in the config refused.
pub(super) fn hf_caps(
    hf: &HfConfig,
    family: &str,
    defaults: Option<[f64; 2]>,
) -> Result<[Option<f32>; 2]> {
    let caps = [
        ("attn_logit_softcapping", hf.attn_logit_softcapping),
        ("final_logit_softcapping", hf.final_logit_softcapping),
    ];
    let mut out = [None; 2];
    for (i, (slot, (name, cap))) in out.iter_mut().zip(caps).enumerate() {
        let cap = match cap {
            None => defaults.map(|d| d[i]),
            Some(c) => c.filter(|c| *c != 0.0),
        };
        if defaults.is_none() && cap.is_some() {
            return Err(EngineError::Config(format!(
                "{name} is not supported for {family}"
            )));
        }
        *slot = cap.map(|c| c as f32);
    }
    Ok(out)
}

/// The window of a Gemma config.json, in the layers `layer_types` marks, else in all but
/// every `global_every`-th, rotating with `sliding`'s RoPE.
pub(super) fn hf_window(
    hf: &HfConfig,
    family: &str,
    sliding: (f32, RopeScaling),
    global_every: usize,
) -> Result<SlidingWindow> {
    let window = hf
        .sliding_window
        .ok_or_else(|| EngineError::Config(format!("{family} config has no sliding_window")))?;
    let layers = match hf.sliding_layer_types()? {
        Some(layers) => layers,
        None => sliding_layers(hf.num_hidden_layers, global_every),
    };
    Ok(SlidingWindow {
        window,
        layers,
        rope_theta: sliding.0,
        rope_scaling: sliding.1,
    })
}

/// A Gemma config.json's layers on `config`: the full layers' RoPE, norm weights stored
/// less 1, scores scaled by 1/√query_pre_attn_scalar, the caps, and the window.
pub(super) fn hf_layers(
    hf: &HfConfig,
    config: &mut ModelConfig,
    (rope_theta, rope_scaling): (f32, RopeScaling),
    window: SlidingWindow,
    caps: [Option<f32>; 2],
) {
    config.rope_theta = rope_theta;
    config.rope_scaling = rope_scaling;
    config.norm_weight_offset = 1.0;
    config.attention_scale = Some(
        1.0 / hf
            .query_pre_attn_scalar
            .unwrap_or(config.head_dim as f64)
            .sqrt() as f32,
    );
    [
        config.attn_logit_softcapping,
        config.final_logit_softcapping,
    ] = caps;
    gemma_layers(config, window);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::gguf::{config_from_content, test_file};
    use crate::spec::rope::RopeFactorTensors;
    use candle_core::quantized::gguf_file::Value;
    use serde_json::json;

    #[test]
    fn gemma2_caps_alternate_windows_and_gemma3_refuses_caps() -> Result<()> {
        let gemma = |model_type: &str, extra: serde_json::Value| {
            crate::families::hf::read(
                json!({
                    "model_type": model_type, "vocab_size": 512, "hidden_size": 64,
                    "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 32, "sliding_window": 8,
                }),
                extra,
            )
        };
        // Absent: transformers' defaults.
        let c = gemma("gemma2", json!({}))?;
        assert_eq!(
            (c.attn_logit_softcapping, c.final_logit_softcapping),
            (Some(50.0), Some(30.0))
        );
        assert!(!c.qk_norm);
        let window = c.sliding_window.expect("window");
        assert_eq!(window.layers, [true, false, true, false]);
        assert_eq!(window.rope_theta, c.rope_theta);
        // null: no cap.
        let c = gemma(
            "gemma2",
            json!({"attn_logit_softcapping": null, "final_logit_softcapping": 10.0}),
        )?;
        assert_eq!(
            (c.attn_logit_softcapping, c.final_logit_softcapping),
            (None, Some(10.0))
        );
        assert!(gemma("gemma3_text", json!({}))?.qk_norm);
        match gemma("gemma3_text", json!({"final_logit_softcapping": 30.0})) {
            Err(EngineError::Config(m)) => assert!(m.contains("final_logit_softcapping"), "{m}"),
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    #[test]
    fn gemma_27b_files_scale_scores_by_hidden_over_heads_as_llama_cpp() -> Result<()> {
        let by_hidden = Some(1.0 / 168f32.sqrt());
        assert_eq!(
            config_from_content(&test_file("gemma3", 62), RopeFactorTensors::default())?
                .attention_scale,
            by_hidden
        );
        assert_eq!(
            config_from_content(&test_file("gemma2", 46), RopeFactorTensors::default())?
                .attention_scale,
            by_hidden
        );
        // Other sizes: 1/√head_dim.
        assert_eq!(
            config_from_content(&test_file("gemma3", 34), RopeFactorTensors::default())?
                .attention_scale,
            None
        );
        Ok(())
    }

    #[test]
    fn gemma2_files_cap_at_llama_cpp_defaults_unless_they_say() -> Result<()> {
        let c = config_from_content(&test_file("gemma2", 26), RopeFactorTensors::default())?;
        assert_eq!(
            (c.attn_logit_softcapping, c.final_logit_softcapping),
            (Some(50.0), Some(30.0))
        );
        assert!(!c.qk_norm);
        assert_eq!(
            c.sliding_window.map(|w| w.layers[..4].to_vec()),
            Some(vec![true, false, true, false])
        );
        let mut file = test_file("gemma2", 26);
        file.metadata
            .insert("gemma2.final_logit_softcapping".into(), Value::F32(0.0));
        let c = config_from_content(&file, RopeFactorTensors::default())?;
        assert_eq!(c.final_logit_softcapping, None);
        assert!(
            config_from_content(&test_file("gemma3", 26), RopeFactorTensors::default())?.qk_norm
        );
        Ok(())
    }
}
