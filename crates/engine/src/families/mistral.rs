//! Mistral (`MistralForCausalLM`; GGUF `mistral`): llama's layer; Mistral 7B v0.1 attends
//! to its last `sliding_window` positions in every layer.

use crate::error::Result;
use crate::families::hf_config::HfConfig;
use crate::families::row::{nothing_more_gguf, HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};

static MISTRAL: Family = Family {
    name: "mistral",
    hf_names: &["mistral", "MistralForCausalLM"],
    gguf_names: &["mistral"],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &MISTRAL,
    layer: Layer::LLAMA,
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Interleaved,
    hf_defaults: HfDefaults::LLAMA,
    gguf_experts: None,
    from_hf,
    from_gguf: nothing_more_gguf,
    fixture: "tiny-mistral",
};

fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    hf.window_in_every_layer(config);
    Ok(())
}
