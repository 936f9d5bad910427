//! Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`; GGUF `qwen2`): llama's layer with biases on the
//! query, key and value projections.

use crate::error::Result;
use crate::families::gguf_metadata::Gguf;
use crate::families::row::{nothing_more_hf, HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};

static QWEN2: Family = Family {
    name: "qwen2",
    hf_names: &["qwen2", "Qwen2ForCausalLM"],
    gguf_names: &["qwen2"],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &QWEN2,
    layer: Layer::LLAMA,
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    // A checkpoint's `attention_bias` may say otherwise.
    hf_defaults: HfDefaults {
        attention_bias: true,
        ..HfDefaults::LLAMA
    },
    gguf_experts: None,
    from_hf: nothing_more_hf,
    from_gguf,
    fixture: "tiny-qwen2",
};

/// Its files hold the biases.
fn from_gguf(_: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    config.attention_bias = true;
    Ok(())
}
