//! Llama (`LlamaForCausalLM`; GGUF `llama`): the layer every family starts from, an
//! RMSNorm before attention and before a SiLU-gated MLP, no biases, RoPE over whole
//! heads. SmolLM2, the default model, is one. llama.cpp's converter writes Mixtral as a
//! `llama` file with experts, which it reads as Mixtral runs.

use crate::families::mixtral;
use crate::families::row::{nothing_more_gguf, nothing_more_hf, HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::RopeStyle;

static LLAMA: Family = Family {
    name: "llama",
    hf_names: &["llama", "LlamaForCausalLM"],
    gguf_names: &["llama"],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &LLAMA,
    layer: Layer::LLAMA,
    hf_rope_style: RopeStyle::Half,
    // llama.cpp's converter permutes llama's query and key rows to pair neighbours.
    gguf_rope_style: RopeStyle::Interleaved,
    hf_defaults: HfDefaults::LLAMA,
    // Mixtral's, in the files that have experts.
    gguf_experts: Some(mixtral::GGUF_EXPERTS),
    from_hf: nothing_more_hf,
    from_gguf: nothing_more_gguf,
    fixture: "tiny-llama",
};
