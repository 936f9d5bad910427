//! `/v1/embeddings` on the real binary serving the default model as an embedding model
//! (`--runner pooling`, last-token pooling): unit vectors of the model's width, the same
//! vector for an input alone, in a batch and as token ids, base64 holding the same
//! floats, usage counting the prompt tokens, and the refusals (`dimensions` on a model
//! not trained for it, generation on an embedding server, another model's name).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

fn vectors(reply: &Value) -> Vec<Vec<f32>> {
    reply["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i, "{reply}");
            assert_eq!(d["object"], "embedding");
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_server_embeds_each_input_as_it_would_alone() {
    let started = common::start_serve(&[], &["--runner", "pooling"], &[]);
    let base = started.base.clone();
    let client = reqwest::Client::new();
    common::wait_ready(&client, &base, Duration::from_secs(120)).await;
    let url = format!("{base}/v1/embeddings");
    let post = |body: Value| {
        let (client, url) = (client.clone(), url.clone());
        async move { common::post_json(&client, &url, &body).await }
    };

    let (status, one) = post(json!({"model": "smollm2", "input": "The cat sat on the mat."})).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["object"], "list");
    assert_eq!(one["model"], "smollm2");
    let alone = vectors(&one).remove(0);
    assert_eq!(alone.len(), 576, "the model's hidden size");
    let norm: f64 = alone
        .iter()
        .map(|x| f64::from(*x).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    let (_, tok) = common::post_json(
        &client,
        &format!("{base}/tokenize"),
        &json!({"prompt": "The cat sat on the mat.", "add_special_tokens": true}),
    )
    .await;
    let ids: Vec<u64> = tok["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(one["usage"]["prompt_tokens"], ids.len());
    assert_eq!(one["usage"]["total_tokens"], ids.len());

    // In a batch with others, and as token ids: the same vector.
    let texts = [
        "Paris is the capital of France.",
        "The cat sat on the mat.",
        "Quarterly revenue rose by four percent.",
    ];
    let (status, many) = post(json!({"model": "smollm2", "input": texts})).await;
    assert_eq!(status, 200, "{many}");
    let batch = vectors(&many);
    assert_eq!(batch.len(), 3);
    let same = cosine(&batch[1], &alone);
    assert!(same >= 0.9999, "batched vs alone: cosine {same}");
    let apart = cosine(&batch[0], &batch[2]);
    assert!(apart < 0.999, "different texts, cosine {apart}");
    let (status, by_ids) = post(json!({"model": "smollm2", "input": [ids]})).await;
    assert_eq!(status, 200, "{by_ids}");
    assert!(cosine(&vectors(&by_ids)[0], &alone) >= 0.9999);

    // base64: the little-endian floats of the same vector.
    let (status, b64) = post(
        json!({"model": "smollm2", "input": "The cat sat on the mat.",
        "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(status, 200, "{b64}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(cosine(&decoded, &alone) >= 0.9999);

    // Refusals.
    let (status, err) = post(json!({"model": "smollm2", "input": "x", "dimensions": 64})).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "dimensions", "{err}");
    let (status, err) = post(json!({"model": "other", "input": "x"})).await;
    assert_eq!(status, 404, "{err}");
    let (status, err) = common::post_json(
        &client,
        &format!("{base}/v1/chat/completions"),
        &json!({"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--runner pooling"),
        "{err}"
    );
    drop(started);
}
