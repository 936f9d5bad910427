//! The OpenAPI 3.1 document of the server's routes, written by hand. A test checks that
//! every route of the router appears here and that real responses carry the required
//! fields declared by these schemas.

use serde_json::{json, Value};

use crate::api::openapi::components::schemas;
use crate::api::openapi::schema::{reference, with_properties};
use crate::api::openapi::{embeddings, messages, rerank};

fn json_response(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": reference(schema) } }
    })
}

fn errors() -> Value {
    json!({
        "description": "An error in OpenAI's envelope (400, 401, 404, 405, 408, 413, 415, 429, 431, 500, 503)",
        "content": { "application/json": { "schema": reference("ErrorResponse") } }
    })
}

/// `/v1/responses`: a Responses object, or its event stream.
fn responses_response() -> Value {
    json!({
        "description": "The response, or with `stream` its events (server-sent events)",
        "content": {
            "application/json": { "schema": reference("Response") },
            "text/event-stream": { "schema": sse_event(json_data(json!({ "type": "object" }))) }
        }
    })
}

/// One server-sent event, as OpenAPI's sequential media types describe an event: an
/// object of its fields, whose `data` is described by `data`.
fn sse_event(data: Value) -> Value {
    json!({
        "type": "object",
        "required": ["data"],
        "properties": {
            "event": { "type": "string" },
            "data": data
        }
    })
}

/// Event data that is JSON text of `schema`.
fn json_data(schema: Value) -> Value {
    json!({ "type": "string", "contentMediaType": "application/json", "contentSchema": schema })
}

/// The data of a completion stream's events: a chunk of `chunk_schema`, an error envelope
/// (a failure after the stream began), or `[DONE]` last.
fn chunk_stream_data(chunk_schema: &str) -> Value {
    json!({ "anyOf": [
        { "const": "[DONE]" },
        json_data(json!({ "anyOf": [reference(chunk_schema), reference("ErrorResponse")] }))
    ] })
}

/// The schemas of `/v1/responses`.
fn responses_schemas() -> Value {
    json!({
        "ResponsesRequest": {
            "type": "object",
            "required": ["model", "input"],
            "properties": {
                "model": { "type": "string" },
                "input": { "oneOf": [
                    { "type": "string" },
                    { "type": "array", "items": { "type": "object" } }
                ] },
                "instructions": { "type": ["string", "null"] },
                "max_output_tokens": { "type": ["integer", "null"], "minimum": 1 },
                "temperature": { "type": ["number", "null"], "minimum": 0, "maximum": 2 },
                "top_p": { "type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1 },
                "stream": { "type": ["boolean", "null"] },
                "store": { "type": ["boolean", "null"] },
                "text": { "type": ["object", "null"] },
                "tools": { "type": ["array", "null"], "items": { "type": "object" } },
                "tool_choice": { "type": ["string", "object", "null"] },
                "parallel_tool_calls": { "type": ["boolean", "null"] },
                "include": { "type": ["array", "null"],
                    "items": { "enum": ["message.output_text.logprobs"] },
                    "description": "`message.output_text.logprobs`: log-probabilities in each `output_text` part and text delta (not with function tools)" },
                "top_logprobs": { "type": ["integer", "null"], "minimum": 0, "maximum": 20,
                    "description": "Alternatives per token; needs `include` with `message.output_text.logprobs`" }
            }
        },
        "Response": {
            "type": "object",
            "required": ["id", "object", "created_at", "status", "model", "output"],
            "properties": {
                "id": { "type": "string" },
                "object": { "const": "response" },
                "created_at": { "type": "integer" },
                "status": { "type": "string", "enum": ["completed", "incomplete"] },
                "model": { "type": "string" },
                "output": { "type": "array", "items": { "type": "object", "required": ["type", "id"] } },
                "usage": { "type": "object",
                    "required": ["input_tokens", "output_tokens", "total_tokens"] }
            }
        }
    })
}

fn json_body(schema: &str) -> Value {
    json!({
        "required": true,
        "content": { "application/json": { "schema": reference(schema) } }
    })
}

/// 200 `Health` or 503 `ProbeFailure`.
fn probe_responses(ok: &str) -> Value {
    json!({
        "200": json_response(ok, "Health"),
        "503": json_response("Not (yet) in this state; `reason` says why", "ProbeFailure")
    })
}

/// The document as this server serves it: `model` in request bodies can only be
/// `served_model` (any other name is a 404).
pub fn document_for(served_model: &str) -> Value {
    let mut doc = document();
    for schema in [
        "ChatCompletionRequest",
        "CompletionRequest",
        "TokenizeRequest",
        "DetokenizeRequest",
        "MessagesRequest",
        "CountTokensRequest",
        "EmbeddingRequest",
        "RerankRequest",
    ] {
        let model = &mut doc["components"]["schemas"][schema]["properties"]["model"];
        if let Some(m) = model.as_object_mut() {
            m.insert("enum".into(), json!([served_model]));
        }
    }
    doc
}

/// The whole document.
pub fn document() -> Value {
    let stream_or_json = |json_schema: &str, chunk_schema: &str| {
        json!({
            "description": "The completion, or with `stream: true` server-sent events: `data: <chunk>` lines, then `data: [DONE]`",
            "content": {
                "application/json": { "schema": reference(json_schema) },
                "text/event-stream": { "schema": sse_event(chunk_stream_data(chunk_schema)) }
            }
        })
    };
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tessera",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "OpenAI-compatible LLM inference server"
        },
        "components": {
            "schemas": with_properties(
                with_properties(
                    with_properties(schemas(), responses_schemas()),
                    messages::schemas()
                ),
                with_properties(embeddings::schemas(), rerank::schemas())
            ),
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } }
        },
        "security": [ { "bearer": [] } ],
        "paths": {
            "/v1/chat/completions": { "post": {
                "operationId": "createChatCompletion",
                "requestBody": json_body("ChatCompletionRequest"),
                "responses": { "200": stream_or_json("ChatCompletion", "ChatCompletionChunk"), "default": errors() }
            } },
            "/v1/completions": { "post": {
                "operationId": "createCompletion",
                "requestBody": json_body("CompletionRequest"),
                "responses": { "200": stream_or_json("Completion", "Completion"), "default": errors() }
            } },
            "/v1/responses": { "post": {
                "operationId": "createResponse",
                "description": "Stateless: `store: true` and `previous_response_id` are refused.",
                "requestBody": json_body("ResponsesRequest"),
                "responses": { "200": responses_response(), "default": errors() }
            } },
            "/v1/models": { "get": {
                "operationId": "listModels",
                "responses": { "200": json_response("The served model", "ModelList"), "default": errors() }
            } },
            "/v1/models/{id}": { "get": {
                "operationId": "retrieveModel",
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } } ],
                "responses": { "200": json_response("The model", "Model"), "default": errors() }
            } },
            "/tokenize": { "post": {
                "operationId": "tokenize",
                "requestBody": json_body("TokenizeRequest"),
                "responses": { "200": json_response("Token ids", "TokenizeResponse"), "default": errors() }
            } },
            "/detokenize": { "post": {
                "operationId": "detokenize",
                "requestBody": json_body("DetokenizeRequest"),
                "responses": { "200": json_response("Text", "DetokenizeResponse"), "default": errors() }
            } },
            "/metrics": { "get": {
                "operationId": "metrics",
                "responses": {
                    "200": { "description": "Scheduler metrics, Prometheus text format",
                             "content": { "text/plain": { "schema": { "type": "string" } } } },
                    "default": errors()
                }
            } },
            "/openapi.json": { "get": {
                "operationId": "openapi",
                "responses": { "200": { "description": "This document",
                    "content": { "application/json": { "schema": { "type": "object" } } } } }
            } },
            "/health": { "get": {
                "operationId": "health",
                "description": "Alias of /readyz.",
                "security": [],
                "responses": probe_responses("Ready to serve requests")
            } },
            "/livez": { "get": {
                "operationId": "livez",
                "description": "Liveness: the process answers and its engine loop is not dead or failing step after step.",
                "security": [],
                "responses": probe_responses("Alive")
            } },
            "/readyz": { "get": {
                "operationId": "readyz",
                "description": "Readiness: model loaded, warm-up done, engine healthy, not draining.",
                "security": [],
                "responses": probe_responses("Ready to serve requests")
            } },
            "/startupz": { "get": {
                "operationId": "startupz",
                "description": "Start-up: model loaded and warm-up generation done.",
                "security": [],
                "responses": probe_responses("Started")
            } },
            "/": { "get": {
                "operationId": "chatPage",
                "description": "The chat page: HTML with its script, streaming through /v1/chat/completions; it asks for the API key itself. A 404 with --no-ui.",
                "security": [],
                "responses": {
                    "200": { "description": "The page",
                             "content": { "text/html": { "schema": { "type": "string" } } } },
                    "default": errors()
                }
            } }
        }
    });
    if let Some(paths) = doc["paths"].as_object_mut() {
        for more in [messages::paths(), embeddings::paths(), rerank::paths()] {
            if let Value::Object(more) = more {
                paths.extend(more);
            }
        }
    }
    doc
}
