//! `/v1/embeddings` in the document: its route and schemas.

use serde_json::{json, Value};

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// The paths.
pub fn paths() -> Value {
    json!({
        "/v1/embeddings": { "post": {
            "operationId": "createEmbedding",
            "description": "Embeddings, on a server started with `--runner pooling`; a generating server answers 400.",
            "requestBody": { "required": true, "content": {
                "application/json": { "schema": reference("EmbeddingRequest") } } },
            "responses": {
                "200": { "description": "One embedding per input, in order", "content": {
                    "application/json": { "schema": reference("EmbeddingList") } } },
                "default": { "description": "An error in OpenAI's envelope (400, 401, 404, 405, 408, 413, 415, 429, 431, 500, 503)", "content": {
                    "application/json": { "schema": reference("ErrorResponse") } } }
            }
        } }
    })
}

/// The schemas.
pub fn schemas() -> Value {
    let ids = json!({ "type": "array", "minItems": 1,
        "items": { "type": "integer", "minimum": 0, "maximum": 4294967295u64 } });
    json!({
        "EmbeddingRequest": {
            "type": "object",
            "required": ["model", "input"],
            "properties": {
                "model": { "type": "string" },
                "input": { "oneOf": [
                    { "type": "string", "minLength": 1 },
                    { "type": "array", "minItems": 1, "maxItems": 2048,
                      "items": { "type": "string", "minLength": 1 } },
                    ids,
                    { "type": "array", "minItems": 1, "maxItems": 2048, "items": ids }
                ] },
                "encoding_format": { "type": "string", "enum": ["float", "base64"] },
                "dimensions": { "type": "integer", "minimum": 1 },
                "user": { "type": "string" }
            }
        },
        "EmbeddingList": {
            "type": "object",
            "required": ["object", "data", "model", "usage"],
            "properties": {
                "object": { "const": "list" },
                "data": { "type": "array", "items": {
                    "type": "object",
                    "required": ["object", "index", "embedding"],
                    "properties": {
                        "object": { "const": "embedding" },
                        "index": { "type": "integer" },
                        "embedding": { "oneOf": [
                            { "type": "array", "items": { "type": "number" } },
                            { "type": "string", "description": "little-endian f32 values in base64" }
                        ] }
                    }
                } },
                "model": { "type": "string" },
                "usage": { "type": "object", "required": ["prompt_tokens", "total_tokens"],
                    "properties": {
                        "prompt_tokens": { "type": "integer" },
                        "total_tokens": { "type": "integer" } } }
            }
        }
    })
}
