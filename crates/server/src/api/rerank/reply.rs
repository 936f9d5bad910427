//! `/v1/rerank` replies, as vLLM and Jina write them: `results` sorted by
//! `relevance_score`, highest first, cut to `top_n`, each with the document's `index`
//! and, when asked, the `document`.

use serde_json::{json, Value};

/// The reply for `scores` (one per document, in request order).
pub fn rerank_reply(
    id: &str,
    model: &str,
    documents: &[String],
    scores: &[f64],
    top_n: Option<usize>,
    return_documents: bool,
    prompt_tokens: usize,
) -> Value {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Highest first; equal scores keep the documents' order.
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    order.truncate(top_n.unwrap_or(order.len()));
    let results: Vec<Value> = order
        .into_iter()
        .map(|i| {
            let mut r = json!({"index": i, "relevance_score": scores[i]});
            if return_documents {
                r["document"] = json!({"text": documents[i]});
            }
            r
        })
        .collect();
    json!({
        "id": id,
        "model": model,
        "results": results,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn results_are_sorted_cut_and_carry_their_documents() {
        let docs = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let r = rerank_reply("id", "m", &docs, &[0.2, 0.9, 0.5], Some(2), true, 7);
        let results = r["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["index"], 1);
        assert_eq!(results[0]["document"]["text"], "b");
        assert_eq!(results[1]["index"], 2);
        assert_eq!(r["usage"]["total_tokens"], 7);
        let bare = rerank_reply("id", "m", &docs, &[0.2, 0.9, 0.5], None, false, 7);
        assert_eq!(bare["results"].as_array().unwrap().len(), 3);
        assert!(bare["results"][0].get("document").is_none());
    }
}
