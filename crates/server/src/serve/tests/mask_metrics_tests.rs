//! The grammar mask time in `/metrics`: one mask per token of a constrained sequence,
//! none for an unconstrained one.

use serde_json::json;

use super::harness::*;

const COUNT: &str = "tessera_structured_output_mask_seconds_count";
const SUM: &str = "tessera_structured_output_mask_seconds_sum";

async fn mask_metrics(s: &TestServer) -> (f64, f64) {
    let m = scraped_metrics(s).await;
    (m[COUNT], m[SUM])
}

#[tokio::test]
async fn mask_time_moves_for_constrained_tokens_only() {
    // Exclusive: no other test's constrained sequence may run meanwhile.
    let _gate = SCHEDULER_GATE.write().await;
    let s = model_server();
    let before = mask_metrics(s).await;

    let (status, body) = post(&s.url("/v1/chat/completions"), &france(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        mask_metrics(s).await,
        before,
        "an unconstrained request computes no mask"
    );

    let schema = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": false
    });
    let constrained = france(json!({
        "max_tokens": 24,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    }));
    let (status, body) = post(&s.url("/v1/chat/completions"), &constrained).await;
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    let value: serde_json::Value = serde_json::from_str(text).expect("JSON under the schema");
    assert!(value["city"].is_string(), "{text}");
    let tokens = body["usage"]["completion_tokens"].as_f64().unwrap();
    let after = mask_metrics(s).await;
    assert_eq!(
        after.0,
        before.0 + tokens,
        "one mask per generated token ({tokens} tokens)"
    );
    assert!(
        after.1 > before.1,
        "mask seconds grew: {before:?} -> {after:?}"
    );
}
