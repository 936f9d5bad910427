//! `response_format`: OpenAI's `text`, `json_object` and `json_schema`, as the engine's
//! [`OutputConstraint`]. The schema itself is compiled (and so checked) by
//! `ValidRequest`, with the model's grammar compiler.

use serde_json::Value;
use tessera_engine::EngineError;
use tessera_protocol::OutputConstraint;

use crate::api::error::ServerError;

const PARAM: &str = "response_format";

/// The constraint `response_format` asks for; `None` for `text` or no field.
pub fn parse_response_format(
    value: Option<&Value>,
) -> Result<Option<OutputConstraint>, ServerError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let invalid = |message: String| ServerError::invalid(PARAM, message);
    let kind = value.get("type").and_then(Value::as_str).ok_or_else(|| {
        invalid(
            "`response_format` must be an object with `type`: \"text\", \"json_object\" or \
             \"json_schema\""
                .into(),
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(OutputConstraint::JsonObject)),
        "json_schema" => {
            let spec = value
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| invalid("`response_format.json_schema` must be an object".into()))?;
            match spec.get("name") {
                Some(Value::String(name)) if valid_name(name) => {}
                Some(_) => {
                    return Err(invalid(
                        "`response_format.json_schema.name` must be 1 to 64 letters, digits, \
                         `_` or `-`"
                            .into(),
                    ))
                }
                None => {
                    return Err(invalid(
                        "`response_format.json_schema.name` is required".into(),
                    ))
                }
            }
            if let Some(strict) = spec.get("strict") {
                if !(strict.is_boolean() || strict.is_null()) {
                    return Err(invalid(
                        "`response_format.json_schema.strict` must be a boolean".into(),
                    ));
                }
            }
            let schema = match spec.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(_))) => s,
                Some(_) => {
                    return Err(invalid(
                        "`response_format.json_schema.schema` must be a JSON schema object".into(),
                    ))
                }
                None => {
                    return Err(invalid(
                        "`response_format.json_schema.schema` is required".into(),
                    ))
                }
            };
            Ok(Some(OutputConstraint::JsonSchema {
                schema: schema.to_string(),
            }))
        }
        other => Err(invalid(format!(
            "response_format type `{other}` is not supported (use \"text\", \"json_object\" \
             or \"json_schema\")"
        ))),
    }
}

/// OpenAI's rule for schema names.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A compile error of a constraint as a 400 on `param`, the field that asked for it.
pub fn constraint_error(param: &str, e: EngineError) -> ServerError {
    match e {
        EngineError::SchemaUnsupported { keyword, message } => ServerError::invalid(
            param,
            format!(
                "the JSON schema uses `{keyword}`, which structured output does not support \
                 ({message})"
            ),
        ),
        EngineError::SchemaInvalid(message) => {
            ServerError::invalid(param, format!("invalid JSON schema: {message}"))
        }
        other => ServerError::invalid(param, other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Option<OutputConstraint>, ServerError> {
        parse_response_format(Some(&v))
    }

    #[test]
    fn the_three_types() {
        assert_eq!(parse(json!({"type": "text"})).ok(), Some(None));
        assert_eq!(
            parse(json!({"type": "json_object"})).ok(),
            Some(Some(OutputConstraint::JsonObject))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            parse(json!({"type": "json_schema",
                         "json_schema": {"name": "a_b-1", "schema": schema, "strict": true}}))
            .ok(),
            Some(Some(OutputConstraint::JsonSchema {
                schema: schema.to_string()
            }))
        );
    }

    #[test]
    fn malformed_formats_are_refused() {
        for bad in [
            json!("json_object"),
            json!({"type": "yaml"}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"name": "a"}}),
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}),
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "strict": "yes"}}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad} accepted");
        }
    }
}
