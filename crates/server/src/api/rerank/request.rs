//! `/v1/rerank` request bodies: `query`, `documents` (strings, or objects with `text`),
//! `top_n`, `return_documents` (default true), `model`, and `instruction` (the
//! reranker's task, an extension).

use serde_json::Value;

use crate::api::error::ServerError;
use crate::api::params::fields::NotedFields;
use crate::api::rerank::prompt::DEFAULT_INSTRUCTION;

/// Most documents in one request.
pub const MAX_DOCUMENTS: usize = 1000;

/// A checked rerank request.
#[derive(Debug, Clone)]
pub struct RerankRequest {
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    pub top_n: Option<usize>,
    pub return_documents: bool,
    pub instruction: String,
    /// Fields nothing read, for the route to log.
    pub ignored: Vec<String>,
}

/// Reads `body` as a rerank request.
pub fn rerank_request(body: &Value) -> Result<RerankRequest, ServerError> {
    let object = body
        .as_object()
        .ok_or_else(|| ServerError::InvalidJson("the request body must be a JSON object".into()))?;
    let fields = NotedFields::new(object);
    let string = |key: &str| -> Result<Option<String>, ServerError> {
        match fields.present(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ServerError::invalid(
                key,
                format!("`{key}` must be a string"),
            )),
        }
    };
    let model = string("model")?;
    let query = string("query")?
        .filter(|q| !q.is_empty())
        .ok_or_else(|| ServerError::invalid("query", "`query` must be a non-empty string"))?;
    let instruction = string("instruction")?.unwrap_or_else(|| DEFAULT_INSTRUCTION.to_string());
    let documents = match fields.present("documents") {
        Some(Value::Array(docs)) if !docs.is_empty() => docs
            .iter()
            .enumerate()
            .map(|(i, d)| document(i, d))
            .collect::<Result<Vec<_>, _>>()?,
        _ => {
            return Err(ServerError::invalid(
                "documents",
                "`documents` must be a non-empty list of strings or of {\"text\": ...} objects",
            ))
        }
    };
    if documents.len() > MAX_DOCUMENTS {
        return Err(ServerError::invalid(
            "documents",
            format!(
                "`documents` holds {}; at most {MAX_DOCUMENTS} are allowed",
                documents.len()
            ),
        ));
    }
    let top_n = match fields.present("top_n") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => {
                return Err(ServerError::invalid(
                    "top_n",
                    "`top_n` must be a positive integer",
                ))
            }
        },
    };
    let return_documents = match fields.present("return_documents") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ServerError::invalid(
                "return_documents",
                "`return_documents` must be true or false",
            ))
        }
    };
    Ok(RerankRequest {
        model,
        query,
        documents,
        top_n,
        return_documents,
        instruction,
        ignored: fields.unread(),
    })
}

fn document(i: usize, d: &Value) -> Result<String, ServerError> {
    let text = match d {
        Value::String(s) => Some(s),
        Value::Object(o) => match o.get("text") {
            Some(Value::String(s)) => Some(s),
            _ => None,
        },
        _ => None,
    };
    text.cloned().ok_or_else(|| {
        ServerError::invalid(
            format!("documents.{i}"),
            "a document must be a string or an object with a string `text`",
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn both_document_forms_and_the_defaults_are_read() {
        let r = rerank_request(&json!({"query": "q", "documents": ["a", {"text": "b"}]})).unwrap();
        assert_eq!(r.documents, vec!["a".to_string(), "b".to_string()]);
        assert_eq!((r.top_n, r.return_documents), (None, true));
        assert_eq!(r.instruction, DEFAULT_INSTRUCTION);
        let r = rerank_request(&json!({"model": "m", "query": "q", "documents": ["a"],
            "top_n": 1, "return_documents": false, "instruction": "I", "extra": 1}))
        .unwrap();
        assert_eq!((r.top_n, r.return_documents), (Some(1), false));
        assert_eq!(r.instruction, "I");
        assert_eq!(r.ignored, vec!["extra".to_string()]);
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (body, param) in [
            (json!({"documents": ["a"]}), "query"),
            (json!({"query": "", "documents": ["a"]}), "query"),
            (json!({"query": "q"}), "documents"),
            (json!({"query": "q", "documents": []}), "documents"),
            (json!({"query": "q", "documents": ["a", 3]}), "documents.1"),
            (
                json!({"query": "q", "documents": [{"title": "a"}]}),
                "documents.0",
            ),
            (
                json!({"query": "q", "documents": ["a"], "top_n": 0}),
                "top_n",
            ),
            (
                json!({"query": "q", "documents": ["a"], "return_documents": 1}),
                "return_documents",
            ),
            (
                json!({"query": "q", "documents": ["a"], "model": 1}),
                "model",
            ),
        ] {
            let err = rerank_request(&body).unwrap_err();
            assert_eq!(err.param(), Some(param), "{body}");
        }
    }
}
