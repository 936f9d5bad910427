//! The OpenAPI schemas of vLLM's request extensions on the completion routes (sampling,
//! stop and cache fields, and structured outputs), merged into the shared generation
//! properties by `openapi.rs`.

use serde_json::{json, Value};

use crate::api::openapi::schema::with_properties;

/// vLLM's extensions of the completion routes.
pub fn vllm_properties() -> Value {
    with_properties(
        json!({
            "stop_token_ids": { "type": ["array", "null"], "items": { "type": "integer", "minimum": 0 },
                "description": "vLLM extension: token ids that end the output" },
            "min_tokens": { "type": ["integer", "null"], "minimum": 0,
                "description": "vLLM extension: no stop applies before this many tokens" },
            "include_stop_str_in_output": { "type": ["boolean", "null"],
                "description": "vLLM extension: keep the stop string or token that ended the output" },
            "allowed_token_ids": { "type": ["array", "null"], "items": { "type": "integer", "minimum": 0 },
                "description": "vLLM extension: the only tokens that may be sampled" },
            "bad_words": { "type": ["array", "null"], "items": { "type": "string" },
                "description": "vLLM extension: words the output may not contain" },
            "truncate_prompt_tokens": { "type": ["integer", "null"], "minimum": -1,
                "description": "vLLM extension: keep only the last this many prompt tokens (-1: as many as the context holds)" },
            "cache_salt": { "type": ["string", "null"],
                "description": "vLLM extension: cached prompt blocks are shared only with requests of the same salt" },
            "skip_special_tokens": { "type": ["boolean", "null"],
                "description": "vLLM extension: leave special tokens out of the text (default true)" }
        }),
        json!({
            "structured_outputs": {
                "type": ["object", "null"],
                "description": "vLLM extension: exactly one of `json`, `regex`, `choice`, `grammar` (Lark syntax) or `json_object`",
                "properties": {
                    "json": { "type": ["object", "boolean", "string"] },
                    "regex": { "type": "string" },
                    "choice": { "type": "array", "items": { "type": "string" } },
                    "grammar": { "type": "string" },
                    "json_object": { "type": "boolean" },
                    "disable_fallback": { "type": "boolean" },
                    "disable_any_whitespace": { "type": "boolean" },
                    "disable_additional_properties": { "type": "boolean" }
                }
            },
            "guided_json": { "type": ["object", "boolean", "string", "null"],
                "description": "Older vLLM name of `structured_outputs.json`" },
            "guided_regex": { "type": ["string", "null"],
                "description": "Older vLLM name of `structured_outputs.regex`" },
            "guided_choice": { "type": ["array", "null"], "items": { "type": "string" },
                "description": "Older vLLM name of `structured_outputs.choice`" },
            "guided_grammar": { "type": ["string", "null"],
                "description": "Older vLLM name of `structured_outputs.grammar`" }
        }),
    )
}
