//! The quantization gate of Hugging Face checkpoints: a `quantization_config` is read
//! only where Tessera reads the weights as they are stored — block-scaled FP8 weights in
//! any family (dequantized at load, `fp8`), and what a family's row says it reads as
//! stored (gpt-oss's MXFP4 experts). Any other method
//! (GPTQ, AWQ, bitsandbytes, ...) stores tensors this loader would misread, so it is
//! refused by name before a weight is read.

use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::families::table::native_quantizations;
use crate::loader::fp8::Fp8Blocks;
use crate::spec::family::Family;

/// The FP8 block shape of a checkpoint of `family` whose `quantization_config` is `q`,
/// where it is block-scaled FP8 (`None` for float weights and the formats the family
/// reads as stored); an error for a method the family's weights cannot be read in.
pub(crate) fn gate(q: Option<&Value>, family: &Family) -> Result<Option<Fp8Blocks>> {
    let Some(q) = q else {
        return Ok(None);
    };
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
    if family.quantizations.contains(&method) {
        return Ok(None);
    }
    if method == "fp8" {
        // Block-scaled e4m3 weights, dequantized at load.
        return Fp8Blocks::from_config(q);
    }
    Err(EngineError::Config(format!(
        "quantization_config.quant_method '{method}' is not supported for {family} \
         (Tessera reads float safetensors, block-scaled FP8 ones, {}, and GGUF files)",
        native_quantizations()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::hf;
    use crate::families::hf_config::HfConfig;

    fn gate_of(model_type: &str, quantization: Value) -> Result<Option<Fp8Blocks>> {
        let hf: HfConfig = serde_json::from_value(serde_json::json!({
            "model_type": model_type, "vocab_size": 512, "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "quantization_config": quantization,
        }))
        .map_err(|e| EngineError::Config(e.to_string()))?;
        gate(hf.quantization_config(), hf::family_row(&hf)?.family)
    }

    #[test]
    fn other_methods_are_refused_by_name_and_mxfp4_is_gpt_oss_s_alone() -> Result<()> {
        assert_eq!(
            gate_of("gpt_oss", serde_json::json!({"quant_method": "mxfp4"}))?,
            None
        );
        let awq = gate_of("gpt_oss", serde_json::json!({"quant_method": "awq"}));
        assert!(matches!(awq, Err(EngineError::Config(m)) if m.contains("quant_method 'awq'")));
        // Other families refuse every quantization_config but FP8 blocks.
        let mxfp4 = gate_of("qwen2", serde_json::json!({"quant_method": "mxfp4"}));
        assert!(matches!(mxfp4, Err(EngineError::Config(m)) if m.contains("mxfp4")));
        let fp8 = serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
        assert_eq!(
            gate_of("qwen2", fp8)?,
            Some(Fp8Blocks {
                rows: 128,
                cols: 128
            })
        );
        Ok(())
    }
}
