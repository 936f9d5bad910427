//! The SSE frames of a streamed completion, for arbitrary generated text: every frame is
//! `data: <one line>\n\n`, parses back as JSON (or is `[DONE]`), and carries the text
//! exactly.

use std::convert::Infallible;

use axum::response::sse::Sse;
use axum::response::IntoResponse;
use futures_util::stream;
use serde_json::Value;
use tessera_server::api::response::{TokenLogprob, Usage};
use tessera_server::serve::routes::chat::ChatFormat;
use tessera_server::serve::routes::completions::CompletionFormat;
use tessera_server::serve::stream::{frame, ChoiceEnd, ChunkFormat};

use crate::model::runtime;

/// Input: a flags byte (bit 0: completion rather than chat; bit 1: with logprobs), then
/// text deltas separated by NUL bytes.
pub fn sse_frames(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let texts: Vec<String> = rest
        .split(|&b| b == 0)
        .map(|t| String::from_utf8_lossy(t).into_owned())
        .collect();
    let completion = flags & 1 != 0;
    let logprobs = flags & 2 != 0;
    let model = texts.first().cloned().unwrap_or_default();
    let mut format: Box<dyn ChunkFormat> = if completion {
        Box::new(CompletionFormat::new(
            "cmpl-x".into(),
            1,
            model,
            logprobs,
            texts.clone(),
        ))
    } else {
        Box::new(ChatFormat::new("chatcmpl-x".into(), 1, model, logprobs))
    };
    let mut chunks = format.opening(&[(0, 0)]);
    let opening = chunks.len();
    for text in &texts {
        let lp = [TokenLogprob {
            token: text.clone(),
            logprob: -0.5,
            top: vec![(text.clone(), -0.5)],
        }];
        chunks.extend(format.delta(0, text.clone(), &lp));
    }
    chunks.extend(format.finish(
        0,
        &ChoiceEnd {
            reason: "stop",
            stop_sequence: None,
        },
    ));
    chunks.push(format.usage(Usage::new(1, texts.len())));
    chunks.push("[DONE]".to_string());

    let events: Vec<_> = chunks
        .iter()
        .map(|c| Ok::<_, Infallible>(frame(c)))
        .collect();
    let events = stream::iter(events);
    let body = Sse::new(events).into_response().into_body();
    let bytes = match runtime().block_on(axum::body::to_bytes(body, usize::MAX)) {
        Ok(b) => b,
        Err(e) => panic!("the SSE body failed: {e}"),
    };
    let Ok(wire) = std::str::from_utf8(&bytes) else {
        panic!("the SSE body is not UTF-8");
    };
    let payloads = parse_frames(wire);
    assert_eq!(
        payloads.len(),
        chunks.len(),
        "frames lost or split: {wire:?}"
    );
    for (payload, chunk) in payloads.iter().zip(&chunks) {
        assert_eq!(payload, chunk, "a frame does not carry its chunk");
    }
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    for (i, text) in texts.iter().enumerate() {
        let json: Value = match serde_json::from_str(&payloads[opening + i]) {
            Ok(v) => v,
            Err(e) => panic!("a delta frame is not JSON: {e}"),
        };
        let choice = &json["choices"][0];
        let carried = if completion {
            &choice["text"]
        } else {
            &choice["delta"]["content"]
        };
        assert_eq!(
            carried.as_str(),
            Some(text.as_str()),
            "the delta text changed"
        );
    }
    for payload in &payloads[..payloads.len() - 1] {
        if let Err(e) = serde_json::from_str::<Value>(payload) {
            panic!("a frame is not JSON ({e}): {payload:?}");
        }
    }
}

/// The data of each event in an SSE body, checking the framing: events end with a blank
/// line and every line is a `data: ` field (a JSON chunk is one line).
fn parse_frames(wire: &str) -> Vec<String> {
    assert!(
        wire.ends_with("\n\n"),
        "the body does not end with a blank line"
    );
    wire[..wire.len() - 2]
        .split("\n\n")
        .map(|event| {
            assert!(!event.contains('\r'), "a carriage return in an event");
            let lines: Vec<&str> = event.split('\n').collect();
            assert_eq!(
                lines.len(),
                1,
                "an event of {} lines: {event:?}",
                lines.len()
            );
            match lines[0].strip_prefix("data: ") {
                Some(data) => data.to_string(),
                None => panic!("a line that is not a data field: {:?}", lines[0]),
            }
        })
        .collect()
}
