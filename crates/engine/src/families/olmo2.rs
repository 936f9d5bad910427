//! OLMo 2 (`Olmo2ForCausalLM`; GGUF `olmo2`): llama's layer normalizing the outputs of its
//! halves instead of their inputs (RMSNorms after attention and after the MLP, named as
//! Gemma's), and query and key RMSNorms across all of a token's heads. llama.cpp's
//! converter writes OLMo 3 as an `olmo2` file with a window, which it reads as OLMo 3
//! runs.

use candle_core::quantized::gguf_file::Value;

use crate::error::{EngineError, Result};
use crate::families::gguf_metadata::Gguf;
use crate::families::row::{nothing_more_hf, HfDefaults, Layer, QkNorm, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle, SlidingWindow};
use crate::spec::rope::RopeScaling;

/// OLMo's layer on llama's.
pub(super) const LAYER: Layer = Layer {
    qk_norm: QkNorm::AcrossHeads,
    input_norms: false,
    sandwich_norms: true,
    ..Layer::LLAMA
};

/// OLMo's norms in GGUF files: Gemma's names, without the MLP's input norm.
pub(super) const TENSORS: TensorNames = TensorNames {
    gguf_renames: &[
        (
            "post_attention_layernorm.weight",
            "post_attention_norm.weight",
        ),
        ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
    ],
    ..TensorNames::LLAMA
};

static OLMO2: Family = Family {
    name: "olmo2",
    hf_names: &["olmo2", "Olmo2ForCausalLM"],
    gguf_names: &["olmo2"],
    tensors: TENSORS,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &OLMO2,
    layer: LAYER,
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults::LLAMA,
    gguf_experts: None,
    from_hf: nothing_more_hf,
    from_gguf,
    fixture: "tiny-olmo2",
};

/// llama.cpp's default for OLMo 3: every fourth layer attends to the whole context.
const OLMO3_FULL_LAYER_EVERY: usize = 4;

/// OLMo 3 as llama.cpp's converter writes it (architecture `olmo2`): a window of
/// `attention.sliding_window` in the layers `attention.sliding_window_pattern` marks (by
/// default three of every four), which rotate plainly with `rope.freq_base_swa` (else
/// the file's base); the other layers keep the file's RoPE scaling (OLMo 3's YaRN).
/// An OLMo 2 file states no window.
fn from_gguf(gguf: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    let Some(window) = gguf
        .usize_opt("attention.sliding_window")?
        .filter(|w| *w > 0)
    else {
        return Ok(());
    };
    let n = config.num_layers;
    let key = gguf.key("attention.sliding_window_pattern");
    let layers: Vec<bool> = match gguf.get("attention.sliding_window_pattern") {
        Some(Value::Array(flags)) => flags
            .iter()
            .map(|f| {
                f.to_bool()
                    .map_err(|e| EngineError::Config(format!("metadata '{key}': {e}")))
            })
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(EngineError::Config(format!(
                "metadata '{key}' is not an array"
            )))
        }
        None => (0..n)
            .map(|l| (l + 1) % OLMO3_FULL_LAYER_EVERY != 0)
            .collect(),
    };
    if layers.len() != n {
        return Err(EngineError::Config(format!(
            "metadata '{key}' lists {} layers of {n}",
            layers.len()
        )));
    }
    config.sliding_window = Some(SlidingWindow {
        window,
        layers,
        rope_theta: gguf.f32("rope.freq_base_swa").unwrap_or(config.rope_theta),
        rope_scaling: RopeScaling::None,
    });
    Ok(())
}
