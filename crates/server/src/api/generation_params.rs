//! Request fields shared by chat and text completions, as sent (before validation).
//!
//! Unknown fields are ignored, as OpenAI clients expect; fields we know but cannot
//! honour are refused by [`refuse_unsupported`] with a 400 naming the parameter.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::api::error::ServerError;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Sampling, stopping and streaming fields common to both completion routes.
#[derive(Debug, Clone, Deserialize)]
pub struct GenerationParams {
    pub model: String,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// vLLM extension; 0 or -1 disable it.
    pub top_k: Option<i64>,
    /// vLLM extension.
    pub min_p: Option<f64>,
    pub n: Option<u64>,
    pub stop: Option<StopField>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// vLLM extension.
    pub repetition_penalty: Option<f64>,
    /// Token id (as a string) to a bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Informational only (OpenAI uses it for abuse monitoring).
    pub user: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// vLLM extension: keep generating past end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    pub best_of: Option<u64>,
    /// `text`, `json_object` or `json_schema`; checked by `GenerationSpec`.
    pub response_format: Option<Value>,
}

/// Deserialize `T` from the body, naming the field at fault in the error.
pub fn parse_fields<T: DeserializeOwned>(body: &Value) -> Result<T, ServerError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let inner = e.inner().to_string();
        let path = e.path().to_string();
        let param = if path == "." {
            missing_field_name(&inner)
        } else {
            Some(path.clone())
        };
        let message = match &param {
            Some(p) if !inner.contains("missing field") => format!("invalid `{p}`: {inner}"),
            _ => inner,
        };
        ServerError::InvalidRequest { message, param }
    })
}

fn missing_field_name(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split('`').next().map(str::to_string)
}

/// The body as a JSON object.
pub fn as_object(body: &Value) -> Result<&Map<String, Value>, ServerError> {
    body.as_object()
        .ok_or_else(|| ServerError::InvalidJson("the request body must be a JSON object".into()))
}

/// Which route a body was sent to: some refusals differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completion,
}

/// Refuse fields we know and cannot honour. Each refusal names the parameter.
pub fn refuse_unsupported(body: &Map<String, Value>, route: Route) -> Result<(), ServerError> {
    let present = |k: &str| body.get(k).filter(|v| !v.is_null());
    let non_empty = |v: &Value| match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    };
    for key in ["functions", "function_call"] {
        if present(key).is_some_and(non_empty) {
            return Err(ServerError::invalid(
                key,
                format!("`{key}` is not supported: use `tools` and `tool_choice`"),
            ));
        }
    }
    if route == Route::Completion {
        for key in ["tools", "tool_choice", "parallel_tool_calls"] {
            if present(key).is_some_and(non_empty) {
                return Err(ServerError::invalid(
                    key,
                    format!("`{key}` is only supported by /v1/chat/completions"),
                ));
            }
        }
    }
    if route == Route::Completion && present("suffix").is_some_and(non_empty) {
        return Err(ServerError::invalid("suffix", "`suffix` is not supported"));
    }
    if let Some(modalities) = present("modalities") {
        if modalities != &serde_json::json!(["text"]) {
            return Err(ServerError::invalid(
                "modalities",
                "only the \"text\" modality is supported",
            ));
        }
    }
    for key in ["audio", "prediction", "web_search_options", "guided_json"] {
        if present(key).is_some() {
            return Err(ServerError::invalid(
                key,
                format!("`{key}` is not supported"),
            ));
        }
    }
    // Settings of reasoning models: the served model has no reasoning budget or
    // verbosity setting to honour them with.
    for key in ["reasoning_effort", "verbosity"] {
        if present(key).is_some() {
            return Err(ServerError::invalid(
                key,
                format!("`{key}` is not supported: the model has no such setting"),
            ));
        }
    }
    if present("store").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(ServerError::invalid(
            "store",
            "`store` is not supported: completions are not kept",
        ));
    }
    Ok(())
}
