//! RoPE scaling: how a model's rotary frequencies differ from `base^(-2i/d)` so that it
//! reaches past the context it was first trained on (Llama 3.1's `llama3`, YaRN, linear
//! interpolation, Phi-3's LongRoPE), read from a Hugging Face config (`rope_scaling`, or
//! transformers 5's `rope_parameters`) or from GGUF metadata (`<arch>.rope.scaling.*`, and
//! the `rope_freqs.weight` / `rope_factors_{long,short}.weight` tensors llama.cpp's
//! converter writes), and the frequencies each gives.

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
    /// Per-frequency divisors (one per rotation pair): GGUF's `rope_freqs.weight`.
    FreqFactors(Vec<f32>),
    LongRope(LongRope),
}

/// LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): per-frequency divisors, one set for
/// contexts within the pretraining context and one for longer ones, with cos and sin
/// scaled by `attention_factor`. Which set a model runs with is fixed by the context it
/// is served with ([`RopeScaling::inv_freq`]), as llama.cpp chooses it: every position of
/// a sequence then rotates alike, and cached keys stay valid as the sequence grows.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    pub short_factor: Vec<f64>,
    pub long_factor: Vec<f64>,
    pub original_context: f64,
    pub attention_factor: f64,
}

impl LongRope {
    /// The default attention factor: `sqrt(1 + ln(s) / ln(original))` for a context
    /// stretched `s` times (1 when not stretched), as transformers and llama.cpp's
    /// converter compute it.
    fn default_attention_factor(s: f64, original_context: f64) -> f64 {
        if s <= 1.0 {
            1.0
        } else {
            (1.0 + s.ln() / original_context.ln()).sqrt()
        }
    }

    /// Whether a model served with up to `context` positions uses the long factors.
    pub fn uses_long_factors(&self, context: usize) -> bool {
        context as f64 > self.original_context
    }
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
    /// The inverse frequency of each of the `dim / 2` rotation pairs of the `dim` rotated
    /// dimensions of a head, for a model served with up to `context` positions (which
    /// LongRoPE's choice of factors depends on).
    pub fn inv_freq(&self, dim: usize, theta: f32, context: usize) -> Vec<f64> {
        let half = dim / 2;
        let base = f64::from(theta);
        let plain = (0..half).map(|i| 1.0 / base.powf(2.0 * i as f64 / dim as f64));
        match self {
            RopeScaling::LongRope(l) => {
                let factors = match l.uses_long_factors(context) {
                    true => &l.long_factor,
                    false => &l.short_factor,
                };
                plain.zip(factors).map(|(f, d)| f / d).collect()
            }
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
                let dim = dim as f64;
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
            RopeScaling::LongRope(l) => l.attention_factor,
            _ => 1.0,
        }
    }

    /// Checks the numbers against the `rotary_dim` dimensions of a head that rotate; the
    /// message names the problem.
    pub(crate) fn validate(&self, rotary_dim: usize) -> std::result::Result<(), String> {
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
                if factors.len() != rotary_dim / 2 {
                    return Err(format!(
                        "rope_freqs.weight holds {} factors, {rotary_dim} rotated dimensions \
                         need {}",
                        factors.len(),
                        rotary_dim / 2
                    ));
                }
                factors
                    .iter()
                    .try_for_each(|f| positive("frequency factor", f64::from(*f)))
            }
            RopeScaling::LongRope(l) => {
                for (name, factors) in [
                    ("short_factor", &l.short_factor),
                    ("long_factor", &l.long_factor),
                ] {
                    if factors.len() != rotary_dim / 2 {
                        return Err(format!(
                            "LongRoPE {name} holds {} factors, {rotary_dim} rotated dimensions \
                             need {}",
                            factors.len(),
                            rotary_dim / 2
                        ));
                    }
                    factors.iter().try_for_each(|f| positive(name, *f))?;
                }
                positive("original_max_position_embeddings", l.original_context)?;
                positive("attention_factor", l.attention_factor)
            }
        }
    }

    /// The scheme of one Hugging Face RoPE parameter object (transformers 4's
    /// `rope_scaling`, or a transformers-5 `rope_parameters` entry), named `field` in
    /// errors. The pretraining context is the config's top-level
    /// `original_max_position_embeddings` (`original_context`: Phi-3 keeps it there, and
    /// transformers gives it priority), else the object's own, else
    /// `max_position_embeddings`. Its `partial_rotary_factor` is not scaling; see
    /// [`partial_rotary_factor`].
    pub(crate) fn from_hf(
        params: &serde_json::Value,
        field: &str,
        max_position_embeddings: usize,
        original_context: Option<usize>,
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
        let original_context = match original_context {
            Some(c) => c as f64,
            None => number("original_max_position_embeddings")?
                .unwrap_or(max_position_embeddings as f64),
        };
        let factors = |key: &str| -> Result<Vec<f64>> {
            let list = obj.get(key).and_then(|v| v.as_array()).ok_or_else(|| {
                EngineError::Config(format!("{field}: rope_type '{kind}' needs a list '{key}'"))
            })?;
            list.iter()
                .map(|v| {
                    v.as_f64().ok_or_else(|| {
                        EngineError::Config(format!("{field}.{key}: {v} is not a number"))
                    })
                })
                .collect()
        };
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
            // "su": what Phi-3's first configs called it.
            "longrope" | "su" => {
                let factor =
                    number("factor")?.unwrap_or(max_position_embeddings as f64 / original_context);
                RopeScaling::LongRope(LongRope {
                    short_factor: factors("short_factor")?,
                    long_factor: factors("long_factor")?,
                    original_context,
                    attention_factor: match number("attention_factor")? {
                        Some(a) => a,
                        None => LongRope::default_attention_factor(factor, original_context),
                    },
                })
            }
            other => {
                return fail(format!(
                    "rope_type '{other}' is not supported (supported: default, linear, \
                     llama3, yarn, longrope)"
                ))
            }
        };
        Ok(scaling)
    }

    /// The scheme of a GGUF file's `<arch>.rope.scaling.*` keys (or the older
    /// `<arch>.rope.scale_linear`), as llama.cpp reads them, with the factor tensors the
    /// file holds (`tensors`).
    pub(crate) fn from_gguf(
        md: &HashMap<String, Value>,
        arch: &str,
        tensors: RopeFactorTensors,
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
        let original_context = || -> Result<f64> {
            let k = key("scaling.original_context_length");
            let v = md.get(&k).ok_or_else(|| {
                EngineError::Config(format!(
                    "{} needs {k}",
                    match tensors.longrope() {
                        true => "LongRoPE (rope_factors_long.weight)".to_string(),
                        false => format!("{} 'yarn'", key("scaling.type")),
                    }
                ))
            })?;
            v.to_u32()
                .map(f64::from)
                .map_err(|e| EngineError::Config(format!("metadata '{k}': {e}")))
        };
        let kind = match md.get(&key("scaling.type")) {
            Some(v) => v
                .to_string()
                .map_err(|e| {
                    EngineError::Config(format!("metadata '{}': {e}", key("scaling.type")))
                })?
                .clone(),
            None if tensors.longrope() => "longrope".to_string(),
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
        // with the value that changes nothing. LongRoPE's attention factor is its own.
        for (unsupported, neutral) in [
            ("scaling.yarn_log_multiplier", 0.0),
            ("scaling.yarn_ext_factor", 1.0),
            ("scaling.attn_factor", 1.0),
            ("scaling.alpha", 0.0),
        ] {
            if unsupported == "scaling.attn_factor" && kind == "longrope" {
                continue;
            }
            if let Some(v) = float(unsupported)?.filter(|v| *v != neutral) {
                return fail(format!("{} {v} is not supported", key(unsupported)));
            }
        }
        let scaling = match kind.as_str() {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: factor()? },
            "yarn" => {
                let factor = factor()?;
                let attn = float("scaling.yarn_attn_factor")?.unwrap_or(1.0);
                RopeScaling::Yarn(Yarn {
                    factor,
                    original_context: original_context()?,
                    beta_fast: float("scaling.yarn_beta_fast")?.unwrap_or(32.0),
                    beta_slow: float("scaling.yarn_beta_slow")?.unwrap_or(1.0),
                    attention_factor: attn * yarn_mscale(factor, 1.0),
                    truncate: true,
                })
            }
            "longrope" => {
                let (Some(long), Some(short)) = (&tensors.long, &tensors.short) else {
                    return fail(
                        "LongRoPE needs both rope_factors_long.weight and \
                         rope_factors_short.weight"
                            .into(),
                    );
                };
                let original = original_context()?;
                let context = md
                    .get(&format!("{arch}.context_length"))
                    .and_then(|v| v.to_u32().ok())
                    .map_or(original, f64::from);
                let widen = |v: &Vec<f32>| v.iter().map(|f| f64::from(*f)).collect();
                RopeScaling::LongRope(LongRope {
                    short_factor: widen(short),
                    long_factor: widen(long),
                    original_context: original,
                    attention_factor: match float("scaling.attn_factor")? {
                        Some(a) => a,
                        None => LongRope::default_attention_factor(context / original, original),
                    },
                })
            }
            other => {
                return fail(format!(
                    "{} '{other}' is not supported (supported: none, linear, yarn, longrope)",
                    key("scaling.type")
                ))
            }
        };
        match (tensors.freqs, scaling) {
            (None, scaling) => Ok(scaling),
            (Some(factors), RopeScaling::None) => Ok(RopeScaling::FreqFactors(factors)),
            (Some(_), _) => fail(format!(
                "rope_freqs.weight together with {} '{kind}' is not supported",
                key("scaling.type")
            )),
        }
    }
}

/// The RoPE factor tensors a GGUF file may hold, as f32 values: `rope_freqs.weight`
/// (Llama 3.1's divisors) and LongRoPE's `rope_factors_long.weight` and
/// `rope_factors_short.weight`.
#[derive(Debug, Clone, Default)]
pub struct RopeFactorTensors {
    pub freqs: Option<Vec<f32>>,
    pub long: Option<Vec<f32>>,
    pub short: Option<Vec<f32>>,
}

impl RopeFactorTensors {
    /// The GGUF names of the tensors, in the order of the fields.
    pub const NAMES: [&'static str; 3] = [
        "rope_freqs.weight",
        "rope_factors_long.weight",
        "rope_factors_short.weight",
    ];

    fn longrope(&self) -> bool {
        self.long.is_some() || self.short.is_some()
    }
}

/// `partial_rotary_factor` of a Hugging Face RoPE parameter object (transformers 5 keeps
/// it there; transformers 4 at the config's top level), where it is given.
pub(crate) fn partial_rotary_factor(
    params: &serde_json::Value,
    field: &str,
) -> Result<Option<f64>> {
    match params.get("partial_rotary_factor") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| {
            EngineError::Config(format!(
                "{field}.partial_rotary_factor: expected a number, found {v}"
            ))
        }),
    }
}

/// How many of a head's `head_dim` dimensions rotate under `partial_rotary_factor`, as
/// transformers counts them (`int(head_dim · factor)`): the first ones, paired as the
/// whole head would be.
pub(crate) fn rotary_dim(head_dim: usize, factor: f64) -> Result<usize> {
    let dim = (head_dim as f64 * factor) as usize;
    if !(factor > 0.0 && factor <= 1.0) || dim == 0 || !dim.is_multiple_of(2) {
        return Err(EngineError::Config(format!(
            "partial_rotary_factor {factor} of a head of {head_dim} rotates {dim} dimensions; \
             it must be above 0, at most 1, and rotate an even number of them"
        )));
    }
    Ok(dim)
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
            RopeScaling::LongRope(l) => write!(
                f,
                "LongRoPE (trained over {} positions, attention factor {:.4})",
                l.original_context, l.attention_factor
            ),
        }
    }
}

#[cfg(test)]
mod tests;
