//! The document's component schemas: usage, errors, chat and completions requests and
//! replies, models, tokenizing and probes.

use serde_json::{json, Value};

use crate::api::openapi::schema::{reference, with_properties};
use crate::api::openapi::vllm::vllm_properties;

fn generation_properties() -> Value {
    let openai = json!({
        "model": { "type": "string" },
        "max_tokens": { "type": ["integer", "null"], "minimum": 1 },
        "max_completion_tokens": { "type": ["integer", "null"], "minimum": 1 },
        "temperature": { "type": ["number", "null"], "minimum": 0, "maximum": 2 },
        "top_p": { "type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1 },
        "top_k": { "type": ["integer", "null"] },
        "min_p": { "type": ["number", "null"], "minimum": 0, "maximum": 1 },
        "n": { "type": ["integer", "null"], "minimum": 1 },
        "stop": { "oneOf": [ { "type": "string" }, { "type": "array", "items": { "type": "string" } }, { "type": "null" } ] },
        "seed": { "type": ["integer", "null"] },
        "presence_penalty": { "type": ["number", "null"], "minimum": -2, "maximum": 2 },
        "frequency_penalty": { "type": ["number", "null"], "minimum": -2, "maximum": 2 },
        "repetition_penalty": { "type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 2 },
        "logit_bias": { "type": ["object", "null"], "additionalProperties": { "type": "number" } },
        "user": { "type": ["string", "null"] },
        "stream": { "type": ["boolean", "null"] },
        "stream_options": { "type": ["object", "null"], "properties": { "include_usage": { "type": "boolean" } } },
        "ignore_eos": { "type": ["boolean", "null"] },
        "best_of": { "type": ["integer", "null"] },
        "response_format": {
            "type": ["object", "null"],
            "required": ["type"],
            "properties": {
                "type": { "enum": ["text", "json_object", "json_schema"] },
                "json_schema": {
                    "type": "object",
                    "required": ["name", "schema"],
                    "properties": {
                        "name": { "type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$" },
                        "description": { "type": "string" },
                        "schema": { "type": ["object", "boolean"] },
                        "strict": { "type": ["boolean", "null"] }
                    }
                }
            }
        }
    });
    with_properties(openai, vllm_properties())
}

pub(super) fn schemas() -> Value {
    let usage = json!({
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
            "prompt_tokens": { "type": "integer" },
            "completion_tokens": { "type": "integer" },
            "total_tokens": { "type": "integer" },
            "prompt_tokens_details": {
                "type": "object",
                "required": ["cached_tokens"],
                "properties": { "cached_tokens": { "type": "integer" } }
            }
        }
    });
    let top_logprob = json!({
        "type": "object",
        "required": ["token", "logprob", "bytes"],
        "properties": {
            "token": { "type": "string" },
            "logprob": { "type": "number" },
            "bytes": { "type": "array", "items": { "type": "integer" } }
        }
    });
    let tool_call = json!({
        "type": "object",
        "required": ["id", "type", "function"],
        "properties": {
            "id": { "type": "string" },
            "type": { "const": "function" },
            "function": { "type": "object", "required": ["name", "arguments"], "properties": {
                "name": { "type": "string" }, "arguments": { "type": "string" } } }
        }
    });
    let function_tool = json!({
        "type": "object",
        "required": ["type", "function"],
        "properties": {
            "type": { "const": "function" },
            "function": { "type": "object", "required": ["name"], "properties": {
                "name": { "type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$" },
                "description": { "type": "string" },
                "parameters": { "type": "object" },
                "strict": { "type": ["boolean", "null"] }
            } }
        }
    });
    let tool_choice = json!({ "oneOf": [
        { "type": "string", "enum": ["none", "auto", "required"] },
        { "type": "object", "required": ["type", "function"], "properties": {
            "type": { "const": "function" },
            "function": { "type": "object", "required": ["name"],
                "properties": { "name": { "type": "string" } } } } },
        { "type": "null" }
    ] });
    let tool_call_delta = json!({
        "type": "object", "required": ["index", "function"], "properties": {
            "index": { "type": "integer" },
            "id": { "type": "string" },
            "type": { "const": "function" },
            "function": { "type": "object", "required": ["arguments"], "properties": {
                "name": { "type": "string" },
                "arguments": { "type": "string" } } } }
    });
    json!({
        "ErrorResponse": {
            "type": "object",
            "required": ["error"],
            "properties": { "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": { "type": "string" },
                    "type": { "type": "string" },
                    "param": { "type": ["string", "null"] },
                    "code": { "type": ["string", "null"] }
                }
            } }
        },
        "Usage": usage,
        "ToolCall": tool_call,
        "FunctionTool": function_tool,
        "ChatMessage": {
            "type": "object",
            "required": ["role"],
            "properties": {
                "role": { "type": "string", "enum": ["system", "user", "assistant", "tool"] },
                "content": { "oneOf": [
                    { "type": "string" },
                    { "type": "array", "items": { "type": "object", "required": ["type", "text"],
                        "properties": { "type": { "const": "text" }, "text": { "type": "string" } } } },
                    { "type": "null" }
                ] },
                "name": { "type": "string" },
                "reasoning": { "type": "string", "description": "An assistant turn's thinking" },
                "reasoning_content": { "type": "string", "description": "Older name of `reasoning`" },
                "tool_calls": { "type": "array", "items": reference("ToolCall") },
                "tool_call_id": { "type": "string" }
            }
        },
        "ChatCompletionRequest": {
            "type": "object",
            "required": ["model", "messages"],
            "properties": with_properties(generation_properties(), json!({
                "messages": { "type": "array", "items": reference("ChatMessage") },
                "tools": { "type": ["array", "null"], "items": reference("FunctionTool") },
                "tool_choice": tool_choice,
                "parallel_tool_calls": { "type": ["boolean", "null"] },
                "chat_template_kwargs": { "type": ["object", "null"],
                    "description": "Extra variables for the chat template (vLLM extension), e.g. `enable_thinking`" },
                "add_generation_prompt": { "type": ["boolean", "null"],
                    "description": "Open an assistant turn after the messages (default true)" },
                "continue_final_message": { "type": ["boolean", "null"],
                    "description": "End the prompt inside the final message, for the model to continue it" },
                "logprobs": { "type": ["boolean", "null"] },
                "top_logprobs": { "type": ["integer", "null"], "minimum": 0, "maximum": 20 }
            }))
        },
        "CompletionRequest": {
            "type": "object",
            "required": ["model", "prompt"],
            "properties": with_properties(generation_properties(), json!({
                "prompt": { "oneOf": [
                    { "type": "string" },
                    { "type": "array", "items": { "type": "string" } },
                    { "type": "array", "items": { "type": "integer" } },
                    { "type": "array", "items": { "type": "array", "items": { "type": "integer" } } }
                ] },
                "echo": { "type": ["boolean", "null"] },
                "logprobs": { "type": ["integer", "null"], "minimum": 0, "maximum": 20 },
                "suffix": { "type": ["string", "null"],
                    "description": "Text after the completion: the model writes what goes between `prompt` and it, through its vocabulary's fill-in-the-middle tokens (a 400 when it has none)" }
            }))
        },
        "ChatTokenLogprob": {
            "type": "object",
            "required": ["token", "logprob", "bytes", "top_logprobs"],
            "properties": {
                "token": { "type": "string" },
                "logprob": { "type": "number" },
                "bytes": { "type": "array", "items": { "type": "integer" } },
                "top_logprobs": { "type": "array", "items": top_logprob }
            }
        },
        "ChatLogprobs": {
            "type": ["object", "null"],
            "required": ["content"],
            "properties": { "content": { "type": "array", "items": reference("ChatTokenLogprob") } }
        },
        "ChatCompletion": {
            "type": "object",
            "required": ["id", "object", "created", "model", "choices", "usage"],
            "properties": {
                "id": { "type": "string" },
                "object": { "const": "chat.completion" },
                "created": { "type": "integer" },
                "model": { "type": "string" },
                "choices": { "type": "array", "items": {
                    "type": "object",
                    "required": ["index", "message", "logprobs", "finish_reason"],
                    "properties": {
                        "index": { "type": "integer" },
                        "message": { "type": "object", "required": ["role", "content"],
                            "properties": { "role": { "const": "assistant" },
                                "content": { "type": ["string", "null"] },
                                "tool_calls": { "type": "array", "items": reference("ToolCall") } } },
                        "logprobs": reference("ChatLogprobs"),
                        "finish_reason": { "type": "string", "enum": ["stop", "length", "tool_calls"] }
                    }
                } },
                "usage": reference("Usage")
            }
        },
        "ChatCompletionChunk": {
            "type": "object",
            "required": ["id", "object", "created", "model", "choices"],
            "properties": {
                "id": { "type": "string" },
                "object": { "const": "chat.completion.chunk" },
                "created": { "type": "integer" },
                "model": { "type": "string" },
                "choices": { "type": "array", "items": {
                    "type": "object",
                    "required": ["index", "delta", "finish_reason"],
                    "properties": {
                        "index": { "type": "integer" },
                        "delta": { "type": "object", "properties": {
                            "role": { "const": "assistant" }, "content": { "type": "string" },
                            "tool_calls": { "type": "array", "items": tool_call_delta } } },
                        "logprobs": reference("ChatLogprobs"),
                        "finish_reason": { "type": ["string", "null"] }
                    }
                } },
                "usage": reference("Usage")
            }
        },
        "CompletionLogprobs": {
            "type": ["object", "null"],
            "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
            "properties": {
                "tokens": { "type": "array", "items": { "type": "string" } },
                "token_logprobs": { "type": "array", "items": { "type": "number" } },
                "top_logprobs": { "type": "array", "items": { "type": "object", "additionalProperties": { "type": "number" } } },
                "text_offset": { "type": "array", "items": { "type": "integer" } }
            }
        },
        "Completion": {
            "description": "A text completion; also the shape of each streamed chunk (then `usage` is only in the last chunk, with `stream_options.include_usage`).",
            "type": "object",
            "required": ["id", "object", "created", "model", "choices"],
            "properties": {
                "id": { "type": "string" },
                "object": { "const": "text_completion" },
                "created": { "type": "integer" },
                "model": { "type": "string" },
                "choices": { "type": "array", "items": {
                    "type": "object",
                    "required": ["index", "text", "logprobs", "finish_reason"],
                    "properties": {
                        "index": { "type": "integer" },
                        "text": { "type": "string" },
                        "logprobs": reference("CompletionLogprobs"),
                        "finish_reason": { "type": ["string", "null"] }
                    }
                } },
                "usage": reference("Usage")
            }
        },
        "Model": {
            "type": "object",
            "required": ["id", "object", "created", "owned_by", "max_model_len"],
            "properties": {
                "id": { "type": "string" },
                "object": { "const": "model" },
                "created": { "type": "integer" },
                "owned_by": { "type": "string" },
                "max_model_len": { "type": "integer" }
            }
        },
        "ModelList": {
            "type": "object",
            "required": ["object", "data"],
            "properties": {
                "object": { "const": "list" },
                "data": { "type": "array", "items": reference("Model") }
            }
        },
        "TokenizeRequest": {
            "type": "object",
            "description": "Exactly one of `prompt` and `messages`.",
            "properties": {
                "model": { "type": ["string", "null"] },
                "prompt": { "type": ["string", "null"] },
                "messages": { "type": ["array", "null"], "items": reference("ChatMessage") },
                "add_special_tokens": { "type": ["boolean", "null"] },
                "add_generation_prompt": { "type": ["boolean", "null"] },
                "continue_final_message": { "type": ["boolean", "null"] },
                "chat_template_kwargs": { "type": ["object", "null"] },
                "return_token_strs": { "type": ["boolean", "null"] }
            }
        },
        "TokenizeResponse": {
            "type": "object",
            "required": ["count", "max_model_len", "tokens"],
            "properties": {
                "count": { "type": "integer" },
                "max_model_len": { "type": "integer" },
                "tokens": { "type": "array", "items": { "type": "integer" } },
                "token_strs": { "type": "array", "items": { "type": "string" } }
            }
        },
        "DetokenizeRequest": {
            "type": "object",
            "required": ["tokens"],
            "properties": {
                "model": { "type": ["string", "null"] },
                "tokens": { "type": "array", "items": { "type": "integer" } }
            }
        },
        "DetokenizeResponse": {
            "type": "object",
            "required": ["prompt"],
            "properties": { "prompt": { "type": "string" } }
        },
        "Health": {
            "type": "object",
            "required": ["status"],
            "properties": { "status": { "const": "ok" } }
        },
        "ProbeFailure": {
            "type": "object",
            "required": ["status", "reason"],
            "properties": {
                "status": { "const": "unavailable" },
                "reason": { "type": "string",
                            "enum": ["loading", "warming_up", "draining", "engine_stopped", "engine_failing"] }
            }
        }
    })
}
