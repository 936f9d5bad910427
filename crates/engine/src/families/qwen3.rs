//! Qwen3 (`Qwen3ForCausalLM`; GGUF `qwen3`): llama's layer with each query and key head
//! RMS-normalized before RoPE.

use crate::families::row::{nothing_more_gguf, nothing_more_hf, HfDefaults, Layer, QkNorm, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::RopeStyle;

static QWEN3: Family = Family {
    name: "qwen3",
    hf_names: &["qwen3", "Qwen3ForCausalLM"],
    gguf_names: &["qwen3"],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &QWEN3,
    layer: Layer {
        qk_norm: QkNorm::PerHead,
        ..Layer::LLAMA
    },
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults::LLAMA,
    gguf_experts: None,
    from_hf: nothing_more_hf,
    from_gguf: nothing_more_gguf,
    fixture: "tiny-qwen3",
};
