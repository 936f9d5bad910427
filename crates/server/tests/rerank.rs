//! `/v1/rerank` on the real binary serving the default model, against transformers
//! (`tests/fixtures/models/smollm2/rerank.json`, made by `make_rerank.py`): the prompt's
//! tokens are transformers', each document's score (`yes` against `no` after the
//! reranker's prompt) is within 0.015 of transformers' on the dequantized weights (the
//! engine's Q4_1 products round activations to 8 bits; the largest difference measured
//! is 0.009), the
//! results are sorted and cut as asked, and `/rerank` answers the same.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

fn fixture() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models/smollm2/rerank.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_scores_match_transformers_and_are_sorted() {
    let reference = fixture();
    let cases = reference["cases"].as_array().unwrap();
    let documents: Vec<&str> = cases
        .iter()
        .map(|c| c["document"].as_str().unwrap())
        .collect();
    let want: Vec<f64> = cases.iter().map(|c| c["score"].as_f64().unwrap()).collect();

    let started = common::start_serve(&[], &[], &[]);
    let base = started.base.clone();
    let client = reqwest::Client::new();
    common::wait_ready(&client, &base, Duration::from_secs(120)).await;

    // The prompt is tokenized as transformers tokenizes it.
    for c in cases {
        let (_, tok) = common::post_json(
            &client,
            &format!("{base}/tokenize"),
            &json!({"prompt": c["prompt"], "add_special_tokens": false}),
        )
        .await;
        assert_eq!(tok["tokens"], c["input_ids"], "{}", c["document"]);
    }

    let body = json!({"model": "smollm2", "query": reference["query"],
        "documents": [documents[0], {"text": documents[1]}, documents[2], documents[3]]});
    let (status, reply) = common::post_json(&client, &format!("{base}/v1/rerank"), &body).await;
    assert_eq!(status, 200, "{reply}");
    let results = reply["results"].as_array().unwrap();
    assert_eq!(results.len(), documents.len());
    let mut previous = f64::INFINITY;
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        let got = r["relevance_score"].as_f64().unwrap();
        println!("{got:.4} (transformers {:.4}) {}", want[i], documents[i]);
        assert!(
            (got - want[i]).abs() <= 0.015,
            "document {i}: {got} against {}",
            want[i]
        );
        assert!(
            got <= previous,
            "results are sorted, highest first: {reply}"
        );
        previous = got;
        assert_eq!(r["document"]["text"], documents[i]);
    }
    let tokens: usize = cases
        .iter()
        .map(|c| c["input_ids"].as_array().unwrap().len())
        .sum();
    assert_eq!(reply["usage"]["prompt_tokens"], tokens);

    // `/rerank`, cut to the best two, without the documents.
    let body = json!({"query": reference["query"], "documents": documents, "top_n": 2,
        "return_documents": false});
    let (status, top) = common::post_json(&client, &format!("{base}/rerank"), &body).await;
    assert_eq!(status, 200, "{top}");
    let top = top["results"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(top[0]["index"], results[0]["index"]);
    assert_eq!(top[1]["index"], results[1]["index"]);
    assert!(top[0].get("document").is_none());

    let (status, err) = common::post_json(
        &client,
        &format!("{base}/v1/rerank"),
        &json!({"query": "q", "documents": []}),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "documents");
    drop(started);
}
