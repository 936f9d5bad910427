//! `/v1/embeddings` on a generating server: a 400 that says how to serve embeddings.

use serde_json::json;

use super::harness::*;

#[tokio::test]
async fn a_generating_server_refuses_embeddings_with_the_flag_to_use() {
    let s = fake_server(None, 64, 16);
    let (status, body) = post(
        &s.url("/v1/embeddings"),
        &json!({"model": "fake", "input": "hello"}),
    )
    .await;
    assert_eq!(status.as_u16(), 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("--runner pooling"), "{message}");
    // A malformed request is still told what is wrong with it.
    let (status, body) = post(
        &s.url("/v1/embeddings"),
        &json!({"model": "fake", "input": []}),
    )
    .await;
    assert_eq!(status.as_u16(), 400);
    assert_eq!(body["error"]["param"], "input", "{body}");
}
