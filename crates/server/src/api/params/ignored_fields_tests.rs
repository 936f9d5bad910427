//! Which fields of a request body nothing reads (logged by the routes as ignored).

use serde_json::json;

use crate::api::chat::request::ChatRequest;
use crate::api::completions::request::CompletionRequest;

#[test]
fn known_fields_of_either_part_are_not_ignored() {
    let chat = ChatRequest::parse(&json!({
        "model": "m", "messages": [{"role": "user", "content": "hi", "name": "ann"}],
        "temperature": 0.5, "top_k": 4, "logprobs": true, "top_logprobs": 2,
        "stream": true, "stream_options": {"include_usage": true}, "user": "u",
        "tools": [], "response_format": {"type": "text", "anything": 1},
        "store": false, "modalities": ["text"],
    }))
    .expect("parse");
    assert_eq!(chat.ignored, Vec::<String>::new());
    let completion = CompletionRequest::parse(&json!({
        "model": "m", "prompt": "hi", "echo": true, "logprobs": 2, "max_tokens": 3,
        "suffix": "", "seed": 1,
    }))
    .expect("parse");
    assert_eq!(completion.ignored, Vec::<String>::new());
}

#[test]
fn unknown_fields_are_named_with_their_paths() {
    let chat = ChatRequest::parse(&json!({
        "model": "m", "top_a": 0.2, "mirostat": 2,
        "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "x", "weight": 3}],
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
    }))
    .expect("parse");
    assert_eq!(
        chat.ignored,
        [
            "messages.1.weight",
            "mirostat",
            "stream_options.continuous_usage_stats",
            "top_a"
        ]
    );
    let completion = CompletionRequest::parse(&json!({
        "model": "m", "prompt": "hi", "messages": [], "typical_p": 0.9,
    }))
    .expect("parse");
    assert_eq!(completion.ignored, ["messages", "typical_p"]);
}
