//! `/v1/embeddings` replies: `{"object": "list", "data": [{"object": "embedding",
//! "index", "embedding"}], "model", "usage"}`, each vector a list of numbers or base64.

use base64::Engine as _;
use serde_json::{json, Value};

use crate::api::embeddings::request::EncodingFormat;

/// The reply for `vectors`, in input order, which took `prompt_tokens` tokens.
pub fn embeddings_reply(
    model: &str,
    vectors: &[Vec<f32>],
    format: EncodingFormat,
    prompt_tokens: usize,
) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            json!({"object": "embedding", "index": index, "embedding": encode(v, format)})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

fn encode(v: &[f32], format: EncodingFormat) -> Value {
    match format {
        EncodingFormat::Float => json!(v),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            json!(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// `v` cut to its first `width` values (a Matryoshka width), scaled back to unit length
/// when the model's embeddings are normalized.
pub fn truncate(mut v: Vec<f32>, width: usize, normalize: bool) -> Vec<f32> {
    v.truncate(width);
    if normalize {
        let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        if norm > 0.0 {
            v.iter_mut()
                .for_each(|x| *x = (f64::from(*x) / norm) as f32);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn base64_holds_the_little_endian_floats() {
        let reply = embeddings_reply("m", &[vec![1.0, -0.5]], EncodingFormat::Base64, 3);
        let text = reply["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        let back: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back, vec![1.0, -0.5]);
        assert_eq!(reply["usage"]["prompt_tokens"], 3);
        assert_eq!(reply["data"][0]["index"], 0);
    }

    #[test]
    fn a_truncated_vector_is_renormalized() {
        assert_eq!(truncate(vec![3.0, 4.0, 12.0], 2, true), vec![0.6, 0.8]);
        assert_eq!(truncate(vec![3.0, 4.0, 12.0], 2, false), vec![3.0, 4.0]);
    }
}
