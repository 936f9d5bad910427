//! A model family as the model and the loader know it: its names in each format, where
//! its files name tensors otherwise than llama's, and the quantized checkpoints it is
//! read from. Every [`ModelConfig`](crate::spec::model::ModelConfig) refers to its family;
//! the families themselves, and how each format describes them, are in
//! `crate::families`.

/// A model family.
#[derive(PartialEq, Eq)]
pub struct Family {
    /// Its name in messages and between nodes (`qwen3_moe`).
    pub name: &'static str,
    /// What a `config.json` calls it: its `model_type` first, then its `architectures`
    /// entry.
    pub hf_names: &'static [&'static str],
    /// What a GGUF file's `general.architecture` calls it; none where llama.cpp's
    /// converter writes the family as another one.
    pub gguf_names: &'static [&'static str],
    /// Where its tensors are named otherwise than llama's.
    pub tensors: TensorNames,
    /// The `quantization_config.quant_method`s of its checkpoints read as they are
    /// stored, besides block-scaled FP8, which every family reads.
    pub quantizations: &'static [&'static str],
}

/// Messages and logs name a family by its name alone.
impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Where a family's files name a layer's tensors otherwise than llama's.
#[derive(Debug, PartialEq, Eq)]
pub struct TensorNames {
    /// The canonical names of a sandwich layer's norms after its input norm: the MLP's
    /// input norm, the norm after attention and the norm after the MLP.
    pub sandwich_norms: [&'static str; 3],
    /// Layer tensors its GGUF files name otherwise than llama's:
    /// `(canonical suffix, GGUF suffix)`.
    pub gguf_renames: &'static [(&'static str, &'static str)],
    /// Its GGUF files' `ffn_up` holds the gate rows and then the up rows (a fused
    /// `gate_up_proj`), and answers for that name only.
    pub gguf_fused_gate_up: bool,
}

impl TensorNames {
    /// Llama's names, and Gemma's for the norms of a sandwich layer (`pre_feedforward`,
    /// `post_attention`, `post_feedforward`), which the families that add such norms
    /// share unless they say otherwise.
    pub const LLAMA: TensorNames = TensorNames {
        sandwich_norms: [
            "pre_feedforward_layernorm.weight",
            "post_attention_layernorm.weight",
            "post_feedforward_layernorm.weight",
        ],
        gguf_renames: &[],
        gguf_fused_gate_up: false,
    };
}

/// The family of a model made in code rather than read from a file (tests, tools):
/// llama's tensor names, and no name in any file.
pub static UNNAMED: Family = Family {
    name: "unnamed",
    hf_names: &[],
    gguf_names: &[],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};
