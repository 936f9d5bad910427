//! The Messages API's (Anthropic's) part of the document: its two routes and schemas.

use serde_json::{json, Value};

/// A schema reference.
fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// Errors of these routes, in Anthropic's envelope.
fn errors() -> Value {
    json!({
        "description": "An error in Anthropic's envelope (400, 401, 404, 405, 408, 413, 415, 429, 431, 500, 529)",
        "content": { "application/json": { "schema": reference("AnthropicError") } }
    })
}

/// The paths.
pub fn paths() -> Value {
    json!({
        "/v1/messages": { "post": {
            "operationId": "createMessage",
            "description": "Anthropic's Messages API. Auth: `x-api-key` or `Authorization: Bearer`.",
            "requestBody": { "required": true, "content": {
                "application/json": { "schema": reference("MessagesRequest") } } },
            "responses": {
                "200": {
                    "description": "The message, or with `stream` Anthropic's events (server-sent events)",
                    "content": {
                        "application/json": { "schema": reference("Message") },
                        "text/event-stream": { "schema": {
                            "type": "object",
                            "properties": {
                                "event": { "type": "string" },
                                "data": { "type": "string",
                                    "contentMediaType": "application/json",
                                    "contentSchema": { "type": "object", "required": ["type"] } }
                            }
                        } }
                    }
                },
                "default": errors()
            }
        } },
        "/v1/messages/count_tokens": { "post": {
            "operationId": "countMessageTokens",
            "requestBody": { "required": true, "content": {
                "application/json": { "schema": reference("CountTokensRequest") } } },
            "responses": {
                "200": { "description": "The prompt's tokens", "content": {
                    "application/json": { "schema": reference("CountTokensResponse") } } },
                "default": errors()
            }
        } }
    })
}

/// The schemas.
pub fn schemas() -> Value {
    let message = json!({
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": { "enum": ["user", "assistant"] },
            "content": { "oneOf": [
                { "type": "string" },
                { "type": "array", "items": { "type": "object", "required": ["type"] } }
            ] }
        }
    });
    let common = json!({
        "model": { "type": "string" },
        "system": { "oneOf": [
            { "type": "string" },
            { "type": "array", "items": { "type": "object", "required": ["type", "text"] } }
        ] },
        "messages": { "type": "array", "items": message },
        "tools": { "type": "array", "items": { "type": "object", "required": ["name", "input_schema"],
            "properties": { "name": { "type": "string" }, "description": { "type": "string" },
                "input_schema": { "type": "object" } } } },
        "tool_choice": { "type": "object", "required": ["type"],
            "properties": { "type": { "enum": ["auto", "any", "tool", "none"] },
                "name": { "type": "string" },
                "disable_parallel_tool_use": { "type": "boolean" } } },
        "thinking": { "type": "object", "required": ["type"],
            "properties": { "type": { "enum": ["enabled", "disabled"] },
                "budget_tokens": { "type": "integer", "minimum": 1 } } }
    });
    let mut request = common.clone();
    if let Some(r) = request.as_object_mut() {
        for (k, v) in [
            ("max_tokens", json!({ "type": "integer", "minimum": 1 })),
            (
                "stop_sequences",
                json!({ "type": "array", "items": { "type": "string" } }),
            ),
            (
                "temperature",
                json!({ "type": "number", "minimum": 0, "maximum": 2 }),
            ),
            (
                "top_p",
                json!({ "type": "number", "exclusiveMinimum": 0, "maximum": 1 }),
            ),
            ("top_k", json!({ "type": "integer", "minimum": 0 })),
            ("stream", json!({ "type": "boolean" })),
            (
                "metadata",
                json!({ "type": "object", "properties": { "user_id": { "type": "string" } } }),
            ),
        ] {
            r.insert(k.into(), v);
        }
    }
    json!({
        "MessagesRequest": {
            "type": "object",
            "required": ["model", "max_tokens", "messages"],
            "properties": request
        },
        "CountTokensRequest": {
            "type": "object",
            "required": ["model", "messages"],
            "properties": common
        },
        "CountTokensResponse": {
            "type": "object",
            "required": ["input_tokens"],
            "properties": { "input_tokens": { "type": "integer" } }
        },
        "Message": {
            "type": "object",
            "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
            "properties": {
                "id": { "type": "string" },
                "type": { "const": "message" },
                "role": { "const": "assistant" },
                "model": { "type": "string" },
                "content": { "type": "array", "items": { "type": "object", "required": ["type"],
                    "properties": { "type": { "enum": ["text", "thinking", "tool_use"] } } } },
                "stop_reason": { "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"] },
                "stop_sequence": { "type": ["string", "null"] },
                "usage": { "type": "object", "required": ["input_tokens", "output_tokens"],
                    "properties": {
                        "input_tokens": { "type": "integer" },
                        "output_tokens": { "type": "integer" },
                        "cache_read_input_tokens": { "type": "integer" },
                        "cache_creation_input_tokens": { "type": "integer" } } }
            }
        },
        "AnthropicError": {
            "type": "object",
            "required": ["type", "error"],
            "properties": {
                "type": { "const": "error" },
                "error": { "type": "object", "required": ["type", "message"],
                    "properties": {
                        "type": { "enum": ["invalid_request_error", "authentication_error",
                            "permission_error", "not_found_error", "request_too_large",
                            "rate_limit_error", "api_error", "overloaded_error"] },
                        "message": { "type": "string" } } }
            }
        }
    })
}
