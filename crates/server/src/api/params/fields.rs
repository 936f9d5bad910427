//! Request fields shared by chat and text completions, as sent (before validation).
//!
//! Unknown fields are ignored, as OpenAI clients expect (and the routes log them, see
//! [`IgnoredFields`]); fields we know but cannot honour are refused by
//! [`refuse_unsupported`] with a 400 naming the parameter.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

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
    /// vLLM extension: token ids that end the output (even with `ignore_eos`).
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM extension: no stop token or stop string ends the output before this many
    /// tokens.
    pub min_tokens: Option<u64>,
    /// vLLM extension: the stop string or stop token that ended the output is part of it.
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM extension: leave special tokens out of the text (default true).
    pub skip_special_tokens: Option<bool>,
    /// vLLM extension: share cached prompt blocks only with requests of the same salt.
    pub cache_salt: Option<String>,
    /// vLLM extension: keep only the last this many prompt tokens (-1: as many as the
    /// context holds).
    pub truncate_prompt_tokens: Option<i64>,
    /// vLLM extension: the only tokens that may be sampled.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM extension: words the output may not contain.
    pub bad_words: Option<Vec<String>>,
    pub best_of: Option<u64>,
    /// `text`, `json_object` or `json_schema`; checked by `GenerationSpec`.
    pub response_format: Option<Value>,
    /// vLLM extension: `json`, `regex`, `choice` or `grammar`; see `structured_outputs`.
    pub structured_outputs: Option<Value>,
    /// Older vLLM names of the `structured_outputs` constraints.
    pub guided_json: Option<Value>,
    pub guided_regex: Option<Value>,
    pub guided_choice: Option<Value>,
    pub guided_grammar: Option<Value>,
}

/// Deserialize `T` from the body, naming the field at fault in the error.
pub fn parse_fields<T: DeserializeOwned>(body: &Value) -> Result<T, ServerError> {
    parse_noting_ignored(body, &mut IgnoredFields::default())
}

/// The fields of a body that no part of the request read. A body is parsed into several
/// structs (the shared fields, the route's own), each of which skips the others' fields:
/// a field is ignored when every parse skipped it, or skipped the object it is in.
#[derive(Debug, Default)]
pub struct IgnoredFields {
    parses: Vec<BTreeSet<String>>,
}

impl IgnoredFields {
    /// The ignored fields' paths (`top_a`, `messages.0.foo`), less the top-level keys in
    /// `checked`, which [`refuse_unsupported`] read and accepted (`store: false`, ...).
    pub fn paths(&self, checked: &BTreeSet<String>) -> Vec<String> {
        let skipped_by = |parse: &BTreeSet<String>, path: &str| {
            parse.iter().any(|p| {
                path == p
                    || path
                        .strip_prefix(p.as_str())
                        .is_some_and(|r| r.starts_with('.'))
            })
        };
        let all: BTreeSet<&String> = self.parses.iter().flatten().collect();
        all.into_iter()
            .filter(|path| self.parses.iter().all(|parse| skipped_by(parse, path)))
            .filter(|path| {
                let top = path.split('.').next().unwrap_or(path);
                !checked.contains(top)
            })
            .cloned()
            .collect()
    }
}

/// A request object whose reads are noted, so that the fields nothing read can be named.
pub struct NotedFields<'a> {
    object: &'a Map<String, Value>,
    read: RefCell<BTreeSet<String>>,
}

impl<'a> NotedFields<'a> {
    pub fn new(object: &'a Map<String, Value>) -> Self {
        NotedFields {
            object,
            read: RefCell::new(BTreeSet::new()),
        }
    }

    /// Field `key` unless it is missing or null; notes it as read either way.
    pub fn present(&self, key: &str) -> Option<&'a Value> {
        self.read.borrow_mut().insert(key.to_string());
        self.object.get(key).filter(|v| !v.is_null())
    }

    /// The keys read so far.
    pub fn read(self) -> BTreeSet<String> {
        self.read.into_inner()
    }

    /// The object's keys that were never read, in order.
    pub fn unread(self) -> Vec<String> {
        let object = self.object;
        let read = self.read();
        object
            .keys()
            .filter(|k| !read.contains(*k))
            .cloned()
            .collect()
    }
}

/// [`parse_fields`], noting in `ignored` the paths of the fields `T` skipped.
pub fn parse_noting_ignored<T: DeserializeOwned>(
    body: &Value,
    ignored: &mut IgnoredFields,
) -> Result<T, ServerError> {
    let mut skipped = BTreeSet::new();
    let mut note = |path: serde_ignored::Path| {
        // serde_ignored writes `?` for the inside of an `Option`: not part of the body.
        let path = path.to_string();
        let segments: Vec<&str> = path.split('.').filter(|s| *s != "?").collect();
        skipped.insert(segments.join("."));
    };
    let de = serde_ignored::Deserializer::new(body, &mut note);
    let parsed = serde_path_to_error::deserialize(de).map_err(|e| {
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
    })?;
    ignored.parses.push(skipped);
    Ok(parsed)
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

/// vLLM's request fields the server cannot honour, refused when set to anything but
/// their default (`false`, empty, `length_penalty` 1, `priority` 0).
fn vllm_refusals(route: Route) -> Vec<(&'static str, &'static str)> {
    let mut refused = vec![
        ("use_beam_search", "`use_beam_search` is not supported"),
        (
            "length_penalty",
            "`length_penalty` is not supported (it applies to beam search)",
        ),
        (
            "prompt_logprobs",
            "`prompt_logprobs` is not supported: use /v1/completions with `echo` and `logprobs`",
        ),
        ("logits_processors", "`logits_processors` is not supported"),
        (
            "return_tokens_as_token_ids",
            "`return_tokens_as_token_ids` is not supported",
        ),
        (
            "priority",
            "`priority` is not supported: requests are served in arrival order",
        ),
    ];
    if route == Route::Chat {
        refused.extend([
            ("echo", "`echo` is only supported by /v1/completions"),
            (
                "add_special_tokens",
                "`add_special_tokens` is not supported: the chat template writes them",
            ),
            ("documents", "`documents` is not supported"),
            (
                "chat_template",
                "a chat template per request is not supported: start the server with \
                 `--chat-template`",
            ),
            (
                "mm_processor_kwargs",
                "`mm_processor_kwargs` is not supported",
            ),
        ]);
    }
    refused
}

/// Refuse fields we know and cannot honour. Each refusal names the parameter. Returns the
/// keys it read: those present were accepted (`store: false`, the text modality).
pub fn refuse_unsupported(
    body: &Map<String, Value>,
    route: Route,
) -> Result<BTreeSet<String>, ServerError> {
    let fields = NotedFields::new(body);
    let present = |k: &str| fields.present(k);
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
    if let Some(modalities) = present("modalities") {
        if modalities != &serde_json::json!(["text"]) {
            return Err(ServerError::invalid(
                "modalities",
                "only the \"text\" modality is supported",
            ));
        }
    }
    for key in [
        "audio",
        "prediction",
        "web_search_options",
        "guided_whitespace_pattern",
        "structural_tag",
    ] {
        if present(key).is_some() {
            return Err(ServerError::invalid(
                key,
                format!("`{key}` is not supported"),
            ));
        }
    }
    // Settings of reasoning models: chat passes `reasoning_effort` to a template that
    // reads it (gpt-oss's); nothing honours `verbosity`.
    for key in ["reasoning_effort", "verbosity"] {
        if key == "reasoning_effort" && route == Route::Chat {
            continue;
        }
        if present(key).is_some() {
            return Err(ServerError::invalid(
                key,
                format!("`{key}` is not supported: the model has no such setting"),
            ));
        }
    }
    for (key, message) in vllm_refusals(route) {
        let set = present(key).is_some_and(|v| match (key, v) {
            ("length_penalty", Value::Number(n)) => n.as_f64() != Some(1.0),
            ("priority", Value::Number(n)) => n.as_f64() != Some(0.0),
            (_, Value::Bool(b)) => *b,
            (_, v) => non_empty(v),
        });
        if set {
            return Err(ServerError::invalid(key, message));
        }
    }
    if present("store").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(ServerError::invalid(
            "store",
            "`store` is not supported: completions are not kept",
        ));
    }
    Ok(fields.read())
}
