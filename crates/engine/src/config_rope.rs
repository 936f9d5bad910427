//! RoPE scaling: how a model's rotary frequencies differ from `base^(-2i/d)` so that it
//! reaches past the context it was first trained on (Llama 3.1's `llama3`, YaRN, linear
//! interpolation), read from a Hugging Face config (`rope_scaling`, or transformers 5's
//! `rope_parameters`) or from GGUF metadata (`<arch>.rope.scaling.*`, and the
//! `rope_freqs.weight` tensor llama.cpp's converter writes for Llama 3.1), and the
//! frequencies each gives.

use std::collections::HashMap;
use std::f64::consts::PI;

use candle_core::quantized::gguf_file::Value;

use crate::error::{EngineError, Result};

/// A rotary scaling scheme. Frequencies follow transformers' `ROPE_INIT_FUNCTIONS` and
/// llama.cpp's `rope_yarn`, which agree wherever both read a scheme.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RopeScaling {
    /// `base^(-2i/d)` unchanged.
    #[default]
    None,
    /// Every frequency divided by `factor` (positions interpolated).
    Linear {
        factor: f64,
    },
    /// Llama 3.1: wavelengths longer than `original_context / low_freq_factor` are
    /// stretched by `factor`, those shorter than `original_context / high_freq_factor`
    /// kept, and the band between blended.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_context: f64,
    },
    Yarn(Yarn),
    /// Per-frequency divisors (`head_dim / 2` of them): GGUF's `rope_freqs.weight`.
    FreqFactors(Vec<f32>),
}

/// YaRN ("NTK-by-parts"): frequencies that turn fewer than `beta_slow` times over the
/// original context are interpolated by `factor`, those turning more than `beta_fast`
/// times kept, with a linear ramp between; cos and sin are scaled by `attention_factor`.
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_context: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub attention_factor: f64,
    /// Round the ramp's ends to whole dimensions (transformers' default, and llama.cpp).
    pub truncate: bool,
}

/// YaRN's default attention factor: `0.1 · mscale · ln(s) + 1` (1 when not stretching).
fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

impl RopeScaling {
    /// The inverse frequency of each of a head's `head_dim / 2` rotation pairs.
    pub fn inv_freq(&self, head_dim: usize, theta: f32) -> Vec<f64> {
        let half = head_dim / 2;
        let base = f64::from(theta);
        let plain = (0..half).map(|i| 1.0 / base.powf(2.0 * i as f64 / head_dim as f64));
        match self {
            RopeScaling::None => plain.collect(),
            RopeScaling::Linear { factor } => plain.map(|f| f / factor).collect(),
            RopeScaling::FreqFactors(factors) => plain
                .zip(factors.iter().chain(std::iter::repeat(&1.0)))
                .map(|(f, d)| f / f64::from(*d))
                .collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                let low_wavelen = original_context / low_freq_factor;
                let high_wavelen = original_context / high_freq_factor;
                plain
                    .map(|f| {
                        let wavelen = 2.0 * PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (original_context / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn(y) => {
                // The dimension at which a frequency turns `rotations` times over the
                // original context.
                let dim = head_dim as f64;
                let correction = |rotations: f64| {
                    dim * (y.original_context / (rotations * 2.0 * PI)).ln() / (2.0 * base.ln())
                };
                let (mut low, mut high) = (correction(y.beta_fast), correction(y.beta_slow));
                if y.truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, high) = (low.max(0.0), high.min(dim - 1.0));
                let span = if high == low { 0.001 } else { high - low };
                plain
                    .enumerate()
                    .map(|(i, f)| {
                        // 1: keep the frequency (extrapolate); 0: interpolate it.
                        let keep = 1.0 - ((i as f64 - low) / span).clamp(0.0, 1.0);
                        f / y.factor * (1.0 - keep) + f * keep
                    })
                    .collect()
            }
        }
    }

    /// What cos and sin are multiplied by (YaRN's attention temperature).
    pub fn attention_factor(&self) -> f64 {
        match self {
            RopeScaling::Yarn(y) => y.attention_factor,
            _ => 1.0,
        }
    }

    /// Checks the numbers against `head_dim`; the message names the problem.
    pub(crate) fn validate(&self, head_dim: usize) -> std::result::Result<(), String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("rope scaling {name} {v} must be positive"))
            }
        };
        match self {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } => positive("factor", *factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                positive("factor", *factor)?;
                positive("low_freq_factor", *low_freq_factor)?;
                positive("original_max_position_embeddings", *original_context)?;
                if high_freq_factor <= low_freq_factor || !high_freq_factor.is_finite() {
                    return Err(format!(
                        "rope scaling high_freq_factor {high_freq_factor} must be above \
                         low_freq_factor {low_freq_factor}"
                    ));
                }
                Ok(())
            }
            RopeScaling::Yarn(y) => {
                positive("factor", y.factor)?;
                positive("original_max_position_embeddings", y.original_context)?;
                positive("beta_fast", y.beta_fast)?;
                positive("beta_slow", y.beta_slow)?;
                positive("attention_factor", y.attention_factor)
            }
            RopeScaling::FreqFactors(factors) => {
                if factors.len() != head_dim / 2 {
                    return Err(format!(
                        "rope_freqs.weight holds {} factors, the head dimension {head_dim} \
                         needs {}",
                        factors.len(),
                        head_dim / 2
                    ));
                }
                factors
                    .iter()
                    .try_for_each(|f| positive("frequency factor", f64::from(*f)))
            }
        }
    }

    /// The scheme of one Hugging Face RoPE parameter object (transformers 4's
    /// `rope_scaling`, or a transformers-5 `rope_parameters` entry), named `field` in
    /// errors. `max_position_embeddings` stands in for a missing
    /// `original_max_position_embeddings`, as in transformers.
    pub(crate) fn from_hf(
        params: &serde_json::Value,
        field: &str,
        max_position_embeddings: usize,
    ) -> Result<Self> {
        let fail = |m: String| Err(EngineError::Config(format!("{field}: {m}")));
        if params.is_null() {
            return Ok(RopeScaling::None);
        }
        let Some(obj) = params.as_object() else {
            return fail(format!("expected an object, found {params}"));
        };
        let kind = obj
            .get("rope_type")
            .or_else(|| obj.get("type"))
            .and_then(|t| t.as_str())
            .unwrap_or("default");
        let number = |key: &str| -> Result<Option<f64>> {
            match obj.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                    EngineError::Config(format!("{field}.{key}: expected a number, found {v}"))
                }),
            }
        };
        let required = |key: &str| -> Result<f64> {
            number(key)?.ok_or_else(|| {
                EngineError::Config(format!("{field}: rope_type '{kind}' needs '{key}'"))
            })
        };
        // transformers: the pretraining context defaults to the model's.
        let original_context =
            number("original_max_position_embeddings")?.unwrap_or(max_position_embeddings as f64);
        let scaling = match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: required("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: required("factor")?,
                low_freq_factor: required("low_freq_factor")?,
                high_freq_factor: required("high_freq_factor")?,
                original_context,
            },
            "yarn" => {
                // No factor: the stretch from the pretraining context to the model's.
                let factor =
                    number("factor")?.unwrap_or(max_position_embeddings as f64 / original_context);
                let attention_factor = match number("attention_factor")? {
                    Some(a) => a,
                    None => match (number("mscale")?, number("mscale_all_dim")?) {
                        (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                            yarn_mscale(factor, m) / yarn_mscale(factor, all)
                        }
                        _ => yarn_mscale(factor, 1.0),
                    },
                };
                let truncate = match obj.get("truncate") {
                    None | Some(serde_json::Value::Null) => true,
                    Some(v) => v.as_bool().ok_or_else(|| {
                        EngineError::Config(format!(
                            "{field}.truncate: expected a boolean, found {v}"
                        ))
                    })?,
                };
                RopeScaling::Yarn(Yarn {
                    factor,
                    original_context,
                    beta_fast: number("beta_fast")?.unwrap_or(32.0),
                    beta_slow: number("beta_slow")?.unwrap_or(1.0),
                    attention_factor,
                    truncate,
                })
            }
            other => {
                return fail(format!(
                    "rope_type '{other}' is not supported (supported: default, linear, \
                     llama3, yarn)"
                ))
            }
        };
        if let Some(p) = number("partial_rotary_factor")?.filter(|p| *p != 1.0) {
            return fail(format!("partial_rotary_factor {p} is not supported"));
        }
        Ok(scaling)
    }

    /// The scheme of a GGUF file's `<arch>.rope.scaling.*` keys (or the older
    /// `<arch>.rope.scale_linear`), as llama.cpp reads them. `freq_factors` holds the
    /// file's `rope_freqs.weight`, where it has one.
    pub(crate) fn from_gguf(
        md: &HashMap<String, Value>,
        arch: &str,
        freq_factors: Option<Vec<f32>>,
    ) -> Result<Self> {
        let key = |k: &str| format!("{arch}.rope.{k}");
        let fail = |m: String| Err(EngineError::Config(m));
        let float = |k: &str| -> Result<Option<f64>> {
            md.get(&key(k))
                .map(|v| {
                    v.to_f32()
                        .map(f64::from)
                        .map_err(|e| EngineError::Config(format!("metadata '{}': {e}", key(k))))
                })
                .transpose()
        };
        let kind = match md.get(&key("scaling.type")) {
            Some(v) => v
                .to_string()
                .map_err(|e| {
                    EngineError::Config(format!("metadata '{}': {e}", key("scaling.type")))
                })?
                .clone(),
            None if float("scale_linear")?.is_some_and(|f| f != 1.0 && f != 0.0) => {
                "linear".to_string()
            }
            None => "none".to_string(),
        };
        let factor = || -> Result<f64> {
            match float("scaling.factor")?.or(float("scale_linear")?) {
                Some(f) => Ok(f),
                None => Err(EngineError::Config(format!(
                    "{} '{kind}' needs {}",
                    key("scaling.type"),
                    key("scaling.factor")
                ))),
            }
        };
        // Keys llama.cpp reads that change the frequencies in ways not implemented here,
        // with the value that changes nothing.
        for (unsupported, neutral) in [
            ("scaling.yarn_log_multiplier", 0.0),
            ("scaling.yarn_ext_factor", 1.0),
            ("scaling.attn_factor", 1.0),
            ("scaling.alpha", 0.0),
        ] {
            if let Some(v) = float(unsupported)?.filter(|v| *v != neutral) {
                return fail(format!("{} {v} is not supported", key(unsupported)));
            }
        }
        let scaling = match kind.as_str() {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: factor()? },
            "yarn" => {
                let factor = factor()?;
                let original = md
                    .get(&key("scaling.original_context_length"))
                    .ok_or_else(|| {
                        EngineError::Config(format!(
                            "{} 'yarn' needs {}",
                            key("scaling.type"),
                            key("scaling.original_context_length")
                        ))
                    })?
                    .to_u32()
                    .map_err(|e| EngineError::Config(e.to_string()))?;
                let attn = float("scaling.yarn_attn_factor")?.unwrap_or(1.0);
                RopeScaling::Yarn(Yarn {
                    factor,
                    original_context: f64::from(original),
                    beta_fast: float("scaling.yarn_beta_fast")?.unwrap_or(32.0),
                    beta_slow: float("scaling.yarn_beta_slow")?.unwrap_or(1.0),
                    attention_factor: attn * yarn_mscale(factor, 1.0),
                    truncate: true,
                })
            }
            other => {
                return fail(format!(
                    "{} '{other}' is not supported (supported: none, linear, yarn)",
                    key("scaling.type")
                ))
            }
        };
        match (freq_factors, scaling) {
            (None, scaling) => Ok(scaling),
            (Some(factors), RopeScaling::None) => Ok(RopeScaling::FreqFactors(factors)),
            (Some(_), _) => fail(format!(
                "rope_freqs.weight together with {} '{kind}' is not supported",
                key("scaling.type")
            )),
        }
    }
}

/// For the load log: `llama3 (factor 8 over 8192 positions)` and the like.
impl std::fmt::Display for RopeScaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RopeScaling::None => write!(f, "unscaled"),
            RopeScaling::Linear { factor } => write!(f, "linear (factor {factor})"),
            RopeScaling::Llama3 {
                factor,
                original_context,
                ..
            } => write!(
                f,
                "llama3 (factor {factor} over {original_context} positions)"
            ),
            RopeScaling::Yarn(y) => write!(
                f,
                "YaRN (factor {} over {} positions, attention factor {:.4})",
                y.factor, y.original_context, y.attention_factor
            ),
            RopeScaling::FreqFactors(_) => write!(f, "per-frequency divisors (rope_freqs.weight)"),
        }
    }
}

#[cfg(test)]
#[path = "config_rope_tests.rs"]
mod tests;
