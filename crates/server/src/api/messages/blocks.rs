//! Content blocks of Messages requests: the text of a list of text blocks, the refusal of
//! a block kind this server cannot honour, and `cache_control`.

use serde_json::Value;

use crate::api::error::ServerError;

/// The text of `value`: a string, or a list of text blocks joined by blank lines.
pub(super) fn blocks_text(value: &Value, param: &str) -> Result<String, ServerError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (j, block) in blocks.iter().enumerate() {
                let at = format!("{param}.{j}");
                check_cache_control(block, &at)?;
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => parts.push(text_of(block, &at)?),
                    other => return Err(unsupported_block(other, &at)),
                }
            }
            Ok(parts.join("\n\n"))
        }
        _ => Err(ServerError::invalid(
            param,
            format!("`{param}` must be a string or a list of text blocks"),
        )),
    }
}

pub(super) fn text_of(block: &Value, at: &str) -> Result<String, ServerError> {
    block
        .get("text")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| ServerError::invalid(format!("{at}.text"), "a text block needs `text`"))
}

/// A block of a kind that cannot be honoured here.
pub(super) fn unsupported_block(kind: Option<&str>, at: &str) -> ServerError {
    let why = match kind {
        Some(k @ ("image" | "document" | "search_result" | "container_upload")) => {
            format!("`{k}` blocks are not supported: this server serves text models")
        }
        Some(k @ ("server_tool_use" | "web_search_tool_result" | "web_fetch_tool_result")) => {
            format!("`{k}` blocks are not supported: this server runs no server tools")
        }
        Some(k) => format!("a block of type `{k}` is not supported here"),
        None => "a content block needs a `type`".to_string(),
    };
    ServerError::invalid(format!("{at}.type"), why)
}

/// `cache_control` asks for the prefix cache, which every request gets: only its default
/// lifetime is accepted, since a longer one cannot be promised.
pub(super) fn check_cache_control(block: &Value, at: &str) -> Result<(), ServerError> {
    let Some(cc) = block.get("cache_control").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let at = at.strip_prefix('.').unwrap_or(at);
    let at = if at.is_empty() {
        String::new()
    } else {
        format!("{at}.")
    };
    let kind = cc.get("type").and_then(Value::as_str);
    let ttl = cc.get("ttl").and_then(Value::as_str);
    match (kind, ttl) {
        (Some("ephemeral"), None | Some("5m")) => Ok(()),
        (Some("ephemeral"), Some(other)) => Err(ServerError::invalid(
            format!("{at}cache_control.ttl"),
            format!(
                "a cache lifetime of `{other}` cannot be promised: prompts are cached in the \
                 prefix cache only while it has room"
            ),
        )),
        _ => Err(ServerError::invalid(
            format!("{at}cache_control"),
            "`cache_control` must be {\"type\": \"ephemeral\"}",
        )),
    }
}
