//! `/v1/embeddings` request bodies: `input` as a string, a list of strings, a list of
//! token ids or a list of such lists; `encoding_format` (`float` or `base64`);
//! `dimensions` (a Matryoshka width); `user`.

use serde_json::Value;

use crate::api::error::ServerError;
use crate::api::params::fields::NotedFields;

/// Most inputs in one request, as OpenAI allows.
pub const MAX_INPUTS: usize = 2048;

/// One input to embed.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbeddingInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// How the vectors are written in the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    /// A list of numbers.
    Float,
    /// The little-endian f32 bytes in base64 (what OpenAI's Python client asks for).
    Base64,
}

/// A checked `/v1/embeddings` request.
#[derive(Debug, Clone)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub inputs: Vec<EmbeddingInput>,
    pub format: EncodingFormat,
    pub dimensions: Option<usize>,
    pub user: Option<String>,
    /// Fields nothing read, for the route to log.
    pub ignored: Vec<String>,
}

/// Reads `body` as an embeddings request.
pub fn embeddings_request(body: &Value) -> Result<EmbeddingsRequest, ServerError> {
    let object = body
        .as_object()
        .ok_or_else(|| ServerError::InvalidJson("the request body must be a JSON object".into()))?;
    let fields = NotedFields::new(object);
    let model = match fields.present("model") {
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(ServerError::invalid("model", "`model` must be a string")),
        None => return Err(ServerError::invalid("model", "`model` is required")),
    };
    let inputs = match fields.present("input") {
        Some(input) => inputs(input)?,
        None => return Err(ServerError::invalid("input", "`input` is required")),
    };
    let format = match fields.present("encoding_format") {
        None => EncodingFormat::Float,
        Some(v) => match v.as_str() {
            Some("float") => EncodingFormat::Float,
            Some("base64") => EncodingFormat::Base64,
            _ => {
                return Err(ServerError::invalid(
                    "encoding_format",
                    "`encoding_format` must be \"float\" or \"base64\"",
                ))
            }
        },
    };
    let dimensions = match fields.present("dimensions") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(d) if d >= 1 => Some(usize::try_from(d).unwrap_or(usize::MAX)),
            _ => {
                return Err(ServerError::invalid(
                    "dimensions",
                    "`dimensions` must be a positive integer",
                ))
            }
        },
    };
    let user = match fields.present("user") {
        None => None,
        Some(Value::String(u)) => Some(u.clone()),
        Some(_) => return Err(ServerError::invalid("user", "`user` must be a string")),
    };
    Ok(EmbeddingsRequest {
        model,
        inputs,
        format,
        dimensions,
        user,
        ignored: fields.unread(),
    })
}

fn inputs(input: &Value) -> Result<Vec<EmbeddingInput>, ServerError> {
    let bad = |why: &str| ServerError::invalid("input", why.to_string());
    let shape = "`input` must be a string, a list of strings, a list of token ids or a list \
                 of lists of token ids";
    let list = match input {
        Value::String(s) => return Ok(vec![text(s, "input")?]),
        Value::Array(list) => list,
        _ => return Err(bad(shape)),
    };
    if list.is_empty() {
        return Err(bad("`input` must not be empty"));
    }
    if list.len() > MAX_INPUTS {
        return Err(bad(&format!(
            "`input` holds {} inputs; at most {MAX_INPUTS} are allowed",
            list.len()
        )));
    }
    if list.iter().all(Value::is_number) {
        return Ok(vec![EmbeddingInput::Tokens(token_ids(list, "input")?)]);
    }
    list.iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => text(s, &format!("input.{i}")),
            Value::Array(ids) => Ok(EmbeddingInput::Tokens(token_ids(
                ids,
                &format!("input.{i}"),
            )?)),
            _ => Err(bad(shape)),
        })
        .collect()
}

fn text(s: &str, param: &str) -> Result<EmbeddingInput, ServerError> {
    if s.is_empty() {
        return Err(ServerError::invalid(
            param,
            format!("`{param}` must not be an empty string"),
        ));
    }
    Ok(EmbeddingInput::Text(s.to_string()))
}

fn token_ids(list: &[Value], param: &str) -> Result<Vec<u32>, ServerError> {
    if list.is_empty() {
        return Err(ServerError::invalid(
            param,
            format!("`{param}` must not be empty"),
        ));
    }
    list.iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ServerError::invalid(
                        param,
                        format!("`{param}` holds {v}, which is not a token id"),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<EmbeddingsRequest, ServerError> {
        embeddings_request(&body)
    }

    #[test]
    fn every_input_shape_is_read() {
        let one = read(json!({"model": "m", "input": "hi"})).unwrap();
        assert_eq!(one.inputs, vec![EmbeddingInput::Text("hi".into())]);
        assert_eq!(one.format, EncodingFormat::Float);
        let many =
            read(json!({"model": "m", "input": ["a", "b"], "encoding_format": "base64"})).unwrap();
        assert_eq!(many.inputs.len(), 2);
        assert_eq!(many.format, EncodingFormat::Base64);
        let ids = read(json!({"model": "m", "input": [1, 2, 3], "dimensions": 4})).unwrap();
        assert_eq!(ids.inputs, vec![EmbeddingInput::Tokens(vec![1, 2, 3])]);
        assert_eq!(ids.dimensions, Some(4));
        let lists = read(json!({"model": "m", "input": [[1], [2, 3]]})).unwrap();
        assert_eq!(lists.inputs[1], EmbeddingInput::Tokens(vec![2, 3]));
        let mixed = read(json!({"model": "m", "input": ["a", [2]], "extra": 1})).unwrap();
        assert_eq!(mixed.inputs.len(), 2);
        assert_eq!(mixed.ignored, vec!["extra".to_string()]);
    }

    #[test]
    fn bad_inputs_are_refused_by_name() {
        for (body, param) in [
            (json!({"input": "x"}), "model"),
            (json!({"model": "m"}), "input"),
            (json!({"model": "m", "input": ""}), "input"),
            (json!({"model": "m", "input": []}), "input"),
            (json!({"model": "m", "input": ["a", ""]}), "input.1"),
            (json!({"model": "m", "input": [[1], []]}), "input.1"),
            (json!({"model": "m", "input": [1, -2]}), "input"),
            (json!({"model": "m", "input": 3}), "input"),
            (
                json!({"model": "m", "input": "a", "encoding_format": "int8"}),
                "encoding_format",
            ),
            (
                json!({"model": "m", "input": "a", "dimensions": 0}),
                "dimensions",
            ),
            (json!({"model": "m", "input": "a", "user": 1}), "user"),
        ] {
            let err = read(body.clone()).unwrap_err();
            assert_eq!(err.param(), Some(param), "{body}: {err}");
        }
        let too_many = vec!["x"; MAX_INPUTS + 1];
        assert_eq!(
            read(json!({"model": "m", "input": too_many}))
                .unwrap_err()
                .param(),
            Some("input")
        );
    }
}
