//! Mistral's, harmony's and GLM-4.5's markers are special tokens: generated ids
//! detokenized the way the server streams them keep the markers for the parser (and the
//! reasoning split), and the calls come out; without them the reply would be plain text.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::{json, Value};
use tessera_tokenizer::{IncrementalDecoder, Tokenizer};

use crate::api::tools::parsers::{ParsedReply, ToolParserKind};
use crate::api::tools::prompt::ToolOutput;

/// SmolLM2's tokenizer with Mistral's tool markers added as special tokens, as in the
/// tokenizers of Mistral's v11+ models.
fn tokenizer_with_markers() -> Arc<Tokenizer> {
    tokenizer_with_special(&["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"])
}

/// SmolLM2's tokenizer with `markers` added as special tokens (ids from 49152).
fn tokenizer_with_special(markers: &[&str]) -> Arc<Tokenizer> {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizer/smollm2-hf");
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("tokenizer.json")).unwrap())
            .unwrap();
    let added = json["added_tokens"].as_array_mut().unwrap();
    for (i, marker) in markers.iter().enumerate() {
        added.push(json!({
            "id": 49152 + i, "content": marker, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }));
    }
    static DIRS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = DIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("tessera-marker-tokens-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::copy(
        fixture.join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .unwrap();
    let tokenizer = Tokenizer::from_hf_dir(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Arc::new(tokenizer)
}

/// Streamed `pieces` as the server reads them: split into reasoning and content by
/// `split`, the content's calls read by `parser`.
fn split_and_parse(
    pieces: &[String],
    split: crate::api::reasoning::ReplySplit,
    mut parser: Box<dyn crate::api::tools::parsers::ToolCallParser>,
) -> (String, ParsedReply) {
    let mut split = crate::api::reasoning::ReasoningSplit::new(split);
    let (mut reasoning, mut reply) = (String::new(), ParsedReply::default());
    let last = pieces.len() - 1;
    for (i, piece) in pieces.iter().enumerate() {
        let part = match i == last {
            true => split.push_last(piece),
            false => split.push(piece),
        };
        reasoning.push_str(&part.reasoning);
        reply.apply(parser.push(&part.content));
    }
    reply.apply(parser.finish());
    (reasoning, reply)
}

/// The text the server streams for `ids`, token by token.
fn streamed(decoder: &mut IncrementalDecoder, ids: &[u32]) -> Vec<String> {
    let mut pieces: Vec<String> = ids.iter().map(|&id| decoder.push(id).unwrap()).collect();
    pieces.push(decoder.finish().unwrap());
    pieces
}

#[test]
fn mistral_markers_survive_detokenizing_and_make_calls() {
    let tok = tokenizer_with_markers();
    let output = ToolOutput::Parsed(ToolParserKind::Mistral);
    let markers = output.marker_ids(&tok);
    assert_eq!(markers, [49152, 49153, 49154]);
    assert!(ToolOutput::Parsed(ToolParserKind::Hermes)
        .marker_ids(&tok)
        .is_empty());

    let generated = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[ARGS]{}";
    let mut ids = tok.encode(generated, false).unwrap();
    assert_eq!(ids[0], 49152, "the marker is one token");
    ids.push(tok.token_to_id("<|im_end|>").unwrap());

    let mut keeping = IncrementalDecoder::new(Arc::clone(&tok), true).keeping(markers);
    let pieces = streamed(&mut keeping, &ids);
    assert_eq!(
        pieces.concat(),
        generated,
        "end-of-turn dropped, markers kept"
    );
    let mut parser = output.parser();
    let mut reply = ParsedReply::default();
    for piece in &pieces {
        reply.apply(parser.push(piece));
    }
    reply.apply(parser.finish());
    assert_eq!(reply.content, None);
    assert_eq!(
        reply.calls,
        [
            (
                "get_weather".to_string(),
                r#"{"city": "Paris"}"#.to_string()
            ),
            ("now".to_string(), "{}".to_string())
        ]
    );

    // Skipping every special token would leave no call to find.
    let mut plain = IncrementalDecoder::new(tok, true);
    let text = streamed(&mut plain, &ids).concat();
    assert_eq!(text, "get_weather{\"city\": \"Paris\"}now{}");
    assert!(ParsedReply::parse(output.parser(), &text).calls.is_empty());
}

/// gpt-oss's harmony markers are special tokens too: the server keeps those the split
/// reads (`<|return|>` and `<|call|>` end the generation), and the reply's analysis,
/// answer and call come apart.
#[test]
fn harmony_markers_survive_detokenizing_and_split_the_reply() {
    use crate::api::reasoning::harmony::KEPT_MARKERS;
    use crate::api::reasoning::ReplySplit;
    use crate::api::tools::prompt::special_ids;

    let tok = tokenizer_with_special(&[
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|constrain|>",
        "<|return|>",
        "<|call|>",
    ]);
    let markers = special_ids(&tok, &KEPT_MARKERS);
    assert_eq!(markers, [49152, 49153, 49154, 49155, 49156]);
    let generated = "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant\
        <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
        {\"city\": \"Paris\"}";
    let mut ids = tok.encode(generated, false).unwrap();
    assert_eq!(ids[0], 49153, "the marker is one token");
    ids.push(tok.token_to_id("<|call|>").unwrap());
    let mut keeping = IncrementalDecoder::new(Arc::clone(&tok), true).keeping(markers);
    let pieces = streamed(&mut keeping, &ids);
    assert_eq!(pieces.concat(), generated, "<|call|> dropped, markers kept");

    let (reasoning, reply) = split_and_parse(
        &pieces,
        ReplySplit::Harmony,
        ToolOutput::Parsed(ToolParserKind::Hermes).parser(),
    );
    assert_eq!(reasoning, "Weather needed.");
    assert_eq!(reply.content, None);
    assert_eq!(reply.calls.len(), 1);
    assert_eq!(reply.calls[0].0, "get_weather");
    let args: Value = serde_json::from_str(&reply.calls[0].1).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
}

/// GLM-4.5's vocabulary holds its call tags and thinking tags as special tokens: the
/// server keeps the ids the glm45 parser and the thinking split read, and a streamed reply
/// splits into its reasoning and a typed call.
#[test]
fn glm45_markers_survive_detokenizing_and_make_calls() {
    use crate::api::reasoning::{ReplySplit, THINK_MARKERS};
    use crate::api::tools::parsers::param_types::ParamTypes;
    use crate::api::tools::prompt::special_ids;
    use crate::api::tools::request::ToolRequest;

    let tok = tokenizer_with_special(&[
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "<think>",
        "</think>",
    ]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}}}}]);
    let tools = ToolRequest::parse(Some(&tools), None, None)
        .unwrap()
        .unwrap();
    let output = ToolOutput::Typed(ToolParserKind::Glm45, ParamTypes::of(&tools));
    let mut markers = output.marker_ids(&tok);
    markers.extend(special_ids(&tok, &THINK_MARKERS));
    assert_eq!(markers, (49152..49160).collect::<Vec<u32>>());
    let generated = "<think>Need the weather.</think>\n<tool_call>get_weather\n<arg_key>city\
        </arg_key>\n<arg_value>10</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2\
        </arg_value>\n</tool_call>";
    let ids = tok.encode(generated, false).unwrap();
    assert_eq!(ids[0], 49158, "the marker is one token");
    let plain = streamed(&mut IncrementalDecoder::new(Arc::clone(&tok), true), &ids);
    assert!(
        !plain.concat().contains("<arg_key>"),
        "dropped when not kept"
    );
    let mut keeping = IncrementalDecoder::new(Arc::clone(&tok), true).keeping(markers);
    let pieces = streamed(&mut keeping, &ids);
    assert_eq!(pieces.concat(), generated);

    let (reasoning, reply) =
        split_and_parse(&pieces, ReplySplit::Think { open: false }, output.parser());
    assert_eq!(reasoning, "Need the weather.");
    assert_eq!(reply.content, None);
    assert_eq!(reply.calls.len(), 1);
    let args: Value = serde_json::from_str(&reply.calls[0].1).unwrap();
    assert_eq!(args, json!({"city": "10", "days": 2}));
}
