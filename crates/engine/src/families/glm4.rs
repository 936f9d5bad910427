//! GLM-4 (`Glm4ForCausalLM`; GGUF `glm4`): llama's layer with query/key/value biases, a
//! fused gate/up projection, RMSNorms also after attention and after the MLP (named
//! `post_self_attn_layernorm` and `post_mlp_layernorm`; llama's `post_attention_layernorm`
//! stays the MLP's input norm), and half of each head rotating in neighbouring pairs, which
//! its files keep as trained.

use crate::error::Result;
use crate::families::gguf_metadata::Gguf;
use crate::families::row::{nothing_more_hf, HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};

static GLM4: Family = Family {
    name: "glm4",
    hf_names: &["glm4", "Glm4ForCausalLM"],
    gguf_names: &["glm4"],
    tensors: TensorNames {
        sandwich_norms: [
            "post_attention_layernorm.weight",
            "post_self_attn_layernorm.weight",
            "post_mlp_layernorm.weight",
        ],
        gguf_renames: &[
            (
                "post_self_attn_layernorm.weight",
                "post_attention_norm.weight",
            ),
            ("post_mlp_layernorm.weight", "post_ffw_norm.weight"),
        ],
        gguf_fused_gate_up: true,
    },
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &GLM4,
    layer: Layer {
        sandwich_norms: true,
        ..Layer::LLAMA
    },
    // GLM rotates neighbouring pairs.
    hf_rope_style: RopeStyle::Interleaved,
    gguf_rope_style: RopeStyle::Interleaved,
    hf_defaults: HfDefaults {
        attention_bias: true,
        ..HfDefaults::LLAMA
    },
    gguf_experts: None,
    from_hf: nothing_more_hf,
    from_gguf,
    fixture: "tiny-glm4",
};

/// Its files hold the biases its checkpoint has (`attention_bias`).
fn from_gguf(gguf: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    config.attention_bias = gguf.has_tensor("blk.0.attn_q.bias");
    Ok(())
}
