//! vLLM's structured-output fields as the engine's [`OutputConstraint`]: the
//! `structured_outputs` object (`json`, `regex`, `choice`, `grammar`, `json_object`) and
//! the older top-level `guided_json`, `guided_regex`, `guided_choice` and
//! `guided_grammar` that clients of earlier vLLM versions still send. A request names at
//! most one constraint, from these fields or `response_format`.

use serde_json::{Map, Value};
use tessera_protocol::OutputConstraint;

use crate::api::error::ServerError;
use crate::api::params::fields::GenerationParams;

const PARAM: &str = "structured_outputs";

/// Keys of `structured_outputs` that name a constraint.
const CONSTRAINT_KEYS: [&str; 5] = ["json", "regex", "choice", "grammar", "json_object"];

/// The constraint the vLLM fields ask for, with the field that asked; `None` when none.
pub fn parse_vllm_constraint(
    p: &GenerationParams,
) -> Result<Option<(&'static str, OutputConstraint)>, ServerError> {
    let present = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
    let legacy = [
        ("guided_json", present(&p.guided_json)),
        ("guided_regex", present(&p.guided_regex)),
        ("guided_choice", present(&p.guided_choice)),
        ("guided_grammar", present(&p.guided_grammar)),
    ];
    let mut found: Option<(&'static str, OutputConstraint)> = None;
    if let Some(object) = present(&p.structured_outputs) {
        found = parse_object(&object)?.map(|c| (PARAM, c));
    }
    for (param, value) in legacy {
        let Some(value) = value else { continue };
        if let Some((first, _)) = &found {
            return Err(one_only(param, first));
        }
        let key = param.trim_start_matches("guided_");
        found = Some((param, constraint_of(param, key, &value)?));
    }
    Ok(found)
}

/// The error for a second constraint in one request.
pub fn one_only(param: &str, other: &str) -> ServerError {
    ServerError::invalid(
        param,
        format!("`{param}` cannot be combined with `{other}`: a request takes one constraint"),
    )
}

/// `structured_outputs`: exactly one constraint key, and options the server honours.
fn parse_object(value: &Value) -> Result<Option<OutputConstraint>, ServerError> {
    let Some(object) = value.as_object() else {
        return Err(ServerError::invalid(
            PARAM,
            "`structured_outputs` must be an object with one of `json`, `regex`, `choice`, \
             `grammar` or `json_object`",
        ));
    };
    check_options(object)?;
    let asked: Vec<(&str, &Value)> = CONSTRAINT_KEYS
        .iter()
        .filter_map(|k| object.get(*k).filter(|v| !v.is_null()).map(|v| (*k, v)))
        .filter(|(k, v)| *k != "json_object" || **v != Value::Bool(false))
        .collect();
    match asked.as_slice() {
        [] => Err(ServerError::invalid(
            PARAM,
            "`structured_outputs` needs one of `json`, `regex`, `choice`, `grammar` or \
             `json_object`",
        )),
        [(key, value)] => constraint_of(&format!("{PARAM}.{key}"), key, value).map(Some),
        [(first, _), (second, _), ..] => Err(ServerError::invalid(
            PARAM,
            format!("`structured_outputs` takes one constraint, got `{first}` and `{second}`"),
        )),
    }
}

/// Refuse keys of `structured_outputs` the server cannot honour, by name; accept those it
/// honours as they are (`disable_any_whitespace: true` is its layout, and it never falls
/// back to unconstrained output).
fn check_options(object: &Map<String, Value>) -> Result<(), ServerError> {
    for (key, value) in object {
        let refused = match key.as_str() {
            k if CONSTRAINT_KEYS.contains(&k) => None,
            "disable_fallback" if value.is_boolean() || value.is_null() => None,
            "disable_any_whitespace" if value == &Value::Bool(false) => Some(
                "JSON is written without free whitespace; `disable_any_whitespace: false` \
                 cannot be honoured"
                    .to_string(),
            ),
            "disable_any_whitespace" if value.is_boolean() || value.is_null() => None,
            "disable_additional_properties" if value == &Value::Bool(true) => Some(
                "`disable_additional_properties` is not supported: set \
                 `additionalProperties: false` in the schema"
                    .to_string(),
            ),
            "disable_additional_properties" if value.is_boolean() || value.is_null() => None,
            "whitespace_pattern" | "structural_tag" => Some(format!("`{key}` is not supported")),
            _ => Some(format!(
                "`{key}` is not a structured-output option (the options are `json`, `regex`, \
                 `choice`, `grammar`, `json_object`, `disable_fallback`, \
                 `disable_any_whitespace` and `disable_additional_properties`)"
            )),
        };
        if let Some(message) = refused {
            return Err(ServerError::invalid(format!("{PARAM}.{key}"), message));
        }
    }
    Ok(())
}

/// The constraint of one field: `key` says which kind (`json`, `regex`, `choice`,
/// `grammar`, `json_object`), `param` how the error names it.
fn constraint_of(param: &str, key: &str, value: &Value) -> Result<OutputConstraint, ServerError> {
    let invalid = |message: &str| ServerError::invalid(param, format!("`{param}` {message}"));
    match key {
        "json" => match value {
            Value::Object(_) | Value::Bool(_) => Ok(OutputConstraint::JsonSchema {
                schema: value.to_string(),
            }),
            // A schema sent as JSON text, as vLLM also takes it.
            Value::String(text) => Ok(OutputConstraint::JsonSchema {
                schema: text.clone(),
            }),
            _ => Err(invalid(
                "must be a JSON schema (an object, or its JSON text)",
            )),
        },
        "regex" => match value {
            Value::String(pattern) if !pattern.is_empty() => Ok(OutputConstraint::Regex {
                pattern: pattern.clone(),
            }),
            _ => Err(invalid("must be a non-empty regular expression")),
        },
        "choice" => {
            let choices: Option<Vec<String>> = value.as_array().and_then(|items| {
                items
                    .iter()
                    .map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_string))
                    .collect()
            });
            match choices {
                Some(choices) if !choices.is_empty() => Ok(OutputConstraint::Choice { choices }),
                _ => Err(invalid("must be a non-empty list of non-empty strings")),
            }
        }
        "grammar" => match value {
            Value::String(lark) if is_gbnf(lark) => Err(invalid(
                "is written in GBNF (`rule ::= ...`); write it in Lark syntax (`rule: ...`), \
                 as llguidance reads it",
            )),
            Value::String(lark) if !lark.trim().is_empty() => {
                Ok(OutputConstraint::Grammar { lark: lark.clone() })
            }
            _ => Err(invalid("must be a grammar in Lark syntax")),
        },
        _ => match value {
            Value::Bool(true) => Ok(OutputConstraint::JsonObject),
            _ => Err(invalid("must be true or false")),
        },
    }
}

/// Whether a grammar defines a rule the GBNF way (`name ::= ...`), which Lark never does.
fn is_gbnf(grammar: &str) -> bool {
    grammar.lines().any(|line| {
        line.split_once("::=").is_some_and(|(name, _)| {
            let name = name.trim();
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::params::fields::parse_fields;
    use serde_json::json;

    fn parse(extra: Value) -> Result<Option<(&'static str, OutputConstraint)>, ServerError> {
        let mut body = json!({"model": "m"});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let params: GenerationParams = parse_fields(&body)?;
        parse_vllm_constraint(&params)
    }

    #[test]
    fn each_kind_from_the_object_and_the_older_fields() {
        let schema = json!({"type": "object"});
        let cases = [
            (
                json!({"structured_outputs": {"json": schema}}),
                "structured_outputs",
                OutputConstraint::JsonSchema {
                    schema: schema.to_string(),
                },
            ),
            (
                json!({"structured_outputs": {"json": "{\"type\":\"integer\"}"}}),
                "structured_outputs",
                OutputConstraint::JsonSchema {
                    schema: "{\"type\":\"integer\"}".into(),
                },
            ),
            (
                json!({"structured_outputs": {"regex": "[0-9]+", "disable_fallback": true}}),
                "structured_outputs",
                OutputConstraint::Regex {
                    pattern: "[0-9]+".into(),
                },
            ),
            (
                json!({"structured_outputs": {"choice": ["yes", "no"], "json_object": false}}),
                "structured_outputs",
                OutputConstraint::Choice {
                    choices: vec!["yes".into(), "no".into()],
                },
            ),
            (
                json!({"structured_outputs": {"grammar": "start: \"a\"+"}}),
                "structured_outputs",
                OutputConstraint::Grammar {
                    lark: "start: \"a\"+".into(),
                },
            ),
            (
                json!({"structured_outputs": {"json_object": true, "disable_any_whitespace": true}}),
                "structured_outputs",
                OutputConstraint::JsonObject,
            ),
            (
                json!({"guided_json": schema}),
                "guided_json",
                OutputConstraint::JsonSchema {
                    schema: schema.to_string(),
                },
            ),
            (
                json!({"guided_regex": "a|b"}),
                "guided_regex",
                OutputConstraint::Regex {
                    pattern: "a|b".into(),
                },
            ),
            (
                json!({"guided_choice": ["x"]}),
                "guided_choice",
                OutputConstraint::Choice {
                    choices: vec!["x".into()],
                },
            ),
            (
                json!({"guided_grammar": "start: \"x\""}),
                "guided_grammar",
                OutputConstraint::Grammar {
                    lark: "start: \"x\"".into(),
                },
            ),
        ];
        for (body, param, constraint) in cases {
            let got = parse(body.clone()).unwrap_or_else(|e| panic!("{body}: {e:?}"));
            assert_eq!(got, Some((param, constraint)), "{body}");
        }
        assert_eq!(parse(json!({"structured_outputs": null})).ok(), Some(None));
        assert_eq!(parse(json!({})).ok(), Some(None));
    }

    #[test]
    fn malformed_or_unhonoured_requests_name_the_field() {
        let cases = [
            (json!({"structured_outputs": "regex"}), "structured_outputs"),
            (json!({"structured_outputs": {}}), "structured_outputs"),
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"regexp": "a"}}),
                "structured_outputs.regexp",
            ),
            (
                json!({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}),
                "structured_outputs.whitespace_pattern",
            ),
            (
                json!({"structured_outputs": {"json_object": true, "disable_any_whitespace": false}}),
                "structured_outputs.disable_any_whitespace",
            ),
            (
                json!({"structured_outputs": {"json": {}, "disable_additional_properties": true}}),
                "structured_outputs.disable_additional_properties",
            ),
            (
                json!({"structured_outputs": {"choice": []}}),
                "structured_outputs.choice",
            ),
            (
                json!({"structured_outputs": {"choice": ["a", 1]}}),
                "structured_outputs.choice",
            ),
            (
                json!({"structured_outputs": {"regex": ""}}),
                "structured_outputs.regex",
            ),
            (
                json!({"structured_outputs": {"json": 3}}),
                "structured_outputs.json",
            ),
            (
                json!({"structured_outputs": {"json_object": "yes"}}),
                "structured_outputs.json_object",
            ),
            (
                json!({"guided_grammar": "root ::= \"a\" | \"b\""}),
                "guided_grammar",
            ),
            (
                json!({"structured_outputs": {"regex": "a"}, "guided_choice": ["a"]}),
                "guided_choice",
            ),
            (
                json!({"guided_regex": "a", "guided_choice": ["a"]}),
                "guided_choice",
            ),
        ];
        for (body, param) in cases {
            match parse(body.clone()) {
                Err(e) => assert_eq!(e.param(), Some(param), "{body}"),
                Ok(c) => panic!("{body} accepted as {c:?}"),
            }
        }
    }

    #[test]
    fn gbnf_is_told_from_lark() {
        assert!(is_gbnf("root ::= item+\nitem ::= \"a\""));
        assert!(!is_gbnf("start: \"::=\" item\nitem: /[a-z]/"));
        assert!(!is_gbnf("start: \"a\""));
    }
}
