//! `/v1/rerank` and `/rerank` in the document: their routes and schemas.

use serde_json::{json, Value};

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn operation(id: &str) -> Value {
    json!({ "post": {
        "operationId": id,
        "description": "Scores each document for the query with a Qwen3-Reranker-style model (the probability of `yes` against `no` after its prompt), highest first.",
        "requestBody": { "required": true, "content": {
            "application/json": { "schema": reference("RerankRequest") } } },
        "responses": {
            "200": { "description": "The documents' scores, highest first", "content": {
                "application/json": { "schema": reference("RerankResponse") } } },
            "default": { "description": "An error in OpenAI's envelope (400, 401, 404, 405, 408, 413, 415, 429, 431, 500, 503)", "content": {
                "application/json": { "schema": reference("ErrorResponse") } } }
        }
    } })
}

/// The paths.
pub fn paths() -> Value {
    json!({
        "/v1/rerank": operation("rerank"),
        "/rerank": operation("rerankUnversioned")
    })
}

/// The schemas.
pub fn schemas() -> Value {
    json!({
        "RerankRequest": {
            "type": "object",
            "required": ["query", "documents"],
            "properties": {
                "model": { "type": "string" },
                "query": { "type": "string", "minLength": 1 },
                "documents": { "type": "array", "minItems": 1, "maxItems": 1000, "items": { "oneOf": [
                    { "type": "string" },
                    { "type": "object", "required": ["text"], "properties": { "text": { "type": "string" } } }
                ] } },
                "top_n": { "type": "integer", "minimum": 1 },
                "return_documents": { "type": "boolean" },
                "instruction": { "type": "string",
                    "description": "The reranker's task (default: web search passages)" }
            }
        },
        "RerankResponse": {
            "type": "object",
            "required": ["id", "model", "results", "usage"],
            "properties": {
                "id": { "type": "string" },
                "model": { "type": "string" },
                "results": { "type": "array", "items": {
                    "type": "object",
                    "required": ["index", "relevance_score"],
                    "properties": {
                        "index": { "type": "integer" },
                        "relevance_score": { "type": "number" },
                        "document": { "type": "object", "properties": { "text": { "type": "string" } } }
                    }
                } },
                "usage": { "type": "object", "properties": {
                    "prompt_tokens": { "type": "integer" },
                    "total_tokens": { "type": "integer" } } }
            }
        }
    })
}
