//! The tools' parameter types, for the forms that write argument values as bare text
//! (GLM-4.5's and Qwen3-Coder's): a value is a string where the schema says the parameter
//! is one, and otherwise read as JSON, or as the Python text a template writes for a
//! boolean or `None`.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::tools::parsers::ToolEvent;
use crate::api::tools::request::ToolRequest;

/// Per function, each parameter's schema types (`type`, a name or a list).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParamTypes(BTreeMap<String, BTreeMap<String, Vec<String>>>);

impl ParamTypes {
    pub fn of(tools: &ToolRequest) -> Self {
        let mut map = BTreeMap::new();
        for tool in &tools.tools {
            let params = tool
                .parameters
                .get("properties")
                .and_then(Value::as_object)
                .map(|props| {
                    props
                        .iter()
                        .map(|(name, schema)| (name.clone(), schema_types(schema)))
                        .collect()
                })
                .unwrap_or_default();
            map.insert(tool.name.clone(), params);
        }
        ParamTypes(map)
    }

    /// Whether `function`'s `param` is a string (`"string"`, or only `"string"` and
    /// `"null"`).
    fn is_string(&self, function: &str, param: &str) -> bool {
        let Some(types) = self.0.get(function).and_then(|p| p.get(param)) else {
            return false;
        };
        types.iter().any(|t| t == "string") && types.iter().all(|t| t == "string" || t == "null")
    }

    /// The arguments' JSON text for `function`'s `param` with the bare value `raw`, after
    /// `sent` earlier arguments of the call: `{"param": value` for the first, `, "param":
    /// value` after.
    pub fn fragment(&self, function: &str, param: &str, raw: &str, sent: usize) -> String {
        let lead = if sent == 0 { "{" } else { ", " };
        let value = self.argument_json(function, param, raw);
        format!("{lead}{}: {value}", Value::String(param.to_string()))
    }

    /// The JSON text of the bare `raw` value of `function`'s `param`.
    fn argument_json(&self, function: &str, param: &str, raw: &str) -> String {
        if self.is_string(function, param) {
            return Value::String(raw.to_string()).to_string();
        }
        let text = raw.trim();
        let value = match serde_json::from_str::<Value>(text) {
            Ok(v) => v,
            // Python's spelling, which templates that write `value | string` produce.
            Err(_) => match text {
                "True" => Value::Bool(true),
                "False" => Value::Bool(false),
                "None" => Value::Null,
                _ => Value::String(raw.to_string()),
            },
        };
        value.to_string()
    }
}

fn schema_types(schema: &Value) -> Vec<String> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// The event that ends call `index`'s arguments after `sent` of them.
pub fn close_call(index: usize, sent: usize) -> ToolEvent {
    let fragment = if sent == 0 { "{}" } else { "}" };
    ToolEvent::CallArguments {
        index,
        fragment: fragment.into(),
    }
}
