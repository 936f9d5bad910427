//! `tools`, `tool_choice` and `parallel_tool_calls` of a chat request: parsed, checked,
//! and turned into what the chat template and the engine need.
//!
//! Function tools only. Every tool needs a valid name and its `parameters` must be a
//! valid JSON schema (checked against the JSON-schema meta-schema); `tool_choice` may
//! name only a tool of the request. With `required` or a named function the output is
//! forced by a grammar (see [`ToolRequest::forced_constraint`]); with `auto` a parser of
//! the model family finds calls in free text.

use serde_json::{json, Map, Value};
use tessera_protocol::OutputConstraint;

use crate::api::error::ServerError;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema of the arguments object.
    pub parameters: Value,
}

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool (the tools are still shown to the model).
    None,
    /// The model decides; calls are found in its output by the family's parser.
    Auto,
    /// At least one call, forced by the grammar.
    Required,
    /// Exactly one call of this function, forced by the grammar.
    Named(String),
}

/// The checked tool fields of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<FunctionTool>,
    pub choice: ToolChoice,
    /// More than one call per reply is allowed (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

/// How a forced reply is laid out; the server reads calls back from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForcedCalls {
    /// The output is the arguments object of this function.
    Named(String),
    /// The output is a JSON array of `{"name": ..., "arguments": {...}}` objects.
    Array,
}

impl ToolRequest {
    /// Parses the three fields. `None` when the request has no tools (then
    /// `tool_choice` may only be `none`).
    pub fn parse(
        tools: Option<&Value>,
        choice: Option<&Value>,
        parallel: Option<&Value>,
    ) -> Result<Option<Self>, ServerError> {
        let tools = match tools.filter(|v| !v.is_null()) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, t)| parse_tool(i, t))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => {
                return Err(ServerError::invalid(
                    "tools",
                    "`tools` must be a list of tools",
                ))
            }
        };
        for (i, tool) in tools.iter().enumerate() {
            if tools[..i].iter().any(|t| t.name == tool.name) {
                return Err(ServerError::invalid(
                    format!("tools[{i}].function.name"),
                    format!("two tools are named `{}`", tool.name),
                ));
            }
        }
        let choice = parse_choice(choice.filter(|v| !v.is_null()))?;
        let parallel = match parallel.filter(|v| !v.is_null()) {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ServerError::invalid(
                    "parallel_tool_calls",
                    "`parallel_tool_calls` must be a boolean",
                ))
            }
        };
        if tools.is_empty() {
            return match choice {
                None | Some(ToolChoice::None) => Ok(None),
                Some(_) => Err(ServerError::invalid(
                    "tool_choice",
                    "`tool_choice` is only allowed when `tools` are given",
                )),
            };
        }
        let choice = choice.unwrap_or(ToolChoice::Auto);
        if let ToolChoice::Named(name) = &choice {
            if !tools.iter().any(|t| &t.name == name) {
                return Err(ServerError::invalid(
                    "tool_choice",
                    format!("`tool_choice` names the function `{name}`, which is not in `tools`"),
                ));
            }
        }
        Ok(Some(ToolRequest {
            tools,
            choice,
            parallel,
        }))
    }

    /// The tools as the chat template sees them (OpenAI's shape, as transformers passes
    /// them).
    pub fn template_tools(&self) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                let mut function = Map::new();
                function.insert("name".into(), Value::String(t.name.clone()));
                if let Some(d) = &t.description {
                    function.insert("description".into(), Value::String(d.clone()));
                }
                function.insert("parameters".into(), t.parameters.clone());
                json!({"type": "function", "function": function})
            })
            .collect()
    }

    /// How the output is forced, for `required` and a named function.
    pub fn forced(&self) -> Option<ForcedCalls> {
        match &self.choice {
            ToolChoice::Required => Some(ForcedCalls::Array),
            ToolChoice::Named(name) => Some(ForcedCalls::Named(name.clone())),
            ToolChoice::None | ToolChoice::Auto => None,
        }
    }

    /// The grammar that forces the calls: the named function's arguments, or a list of
    /// one call (several with `parallel_tool_calls`) of any tool, each call's arguments
    /// valid under that tool's schema.
    pub fn forced_constraint(&self) -> Option<OutputConstraint> {
        let schema = match self.forced()? {
            ForcedCalls::Named(name) => self
                .tools
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.parameters.clone())?,
            ForcedCalls::Array => {
                let calls: Vec<Value> = self
                    .tools
                    .iter()
                    .map(|t| {
                        json!({
                            "type": "object",
                            "properties": {
                                "name": {"const": t.name},
                                "arguments": t.parameters,
                            },
                            "required": ["name", "arguments"],
                            "additionalProperties": false,
                        })
                    })
                    .collect();
                let mut array = json!({
                    "type": "array",
                    "items": {"anyOf": calls},
                    "minItems": 1,
                });
                if !self.parallel {
                    array["maxItems"] = json!(1);
                }
                array
            }
        };
        Some(OutputConstraint::JsonSchema {
            schema: schema.to_string(),
        })
    }
}

fn parse_tool(i: usize, tool: &Value) -> Result<FunctionTool, ServerError> {
    let at = |field: &str| format!("tools[{i}]{field}");
    let object = tool
        .as_object()
        .ok_or_else(|| ServerError::invalid(at(""), "a tool must be an object"))?;
    match object.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(ServerError::invalid(
                at(".type"),
                format!("tool type `{other}` is not supported: only \"function\""),
            ))
        }
        None => {
            return Err(ServerError::invalid(
                at(".type"),
                "a tool needs `type`: \"function\"",
            ))
        }
    }
    let function = object
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            ServerError::invalid(at(".function"), "a function tool needs a `function` object")
        })?;
    let name = match function.get("name") {
        Some(Value::String(name)) if valid_name(name) => name.clone(),
        Some(_) => {
            return Err(ServerError::invalid(
                at(".function.name"),
                "a function name must be 1 to 64 letters, digits, `_` or `-`",
            ))
        }
        None => {
            return Err(ServerError::invalid(
                at(".function.name"),
                "every function tool needs a `name`",
            ))
        }
    };
    let description = match function.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => {
            return Err(ServerError::invalid(
                at(".function.description"),
                "`description` must be a string",
            ))
        }
    };
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => {
            check_schema(p).map_err(|why| {
                ServerError::invalid(
                    at(".function.parameters"),
                    format!("invalid JSON schema for `{name}`: {why}"),
                )
            })?;
            p.clone()
        }
        Some(_) => {
            return Err(ServerError::invalid(
                at(".function.parameters"),
                "`parameters` must be a JSON schema object",
            ))
        }
    };
    if let Some(strict) = function.get("strict") {
        if !(strict.is_boolean() || strict.is_null()) {
            return Err(ServerError::invalid(
                at(".function.strict"),
                "`strict` must be a boolean",
            ));
        }
    }
    Ok(FunctionTool {
        name,
        description,
        parameters,
    })
}

/// Checks `schema` against the JSON-schema meta-schema; the arguments of a call are an
/// object, so a schema typed otherwise is refused too.
fn check_schema(schema: &Value) -> Result<(), String> {
    jsonschema::meta::validate(schema).map_err(|e| e.to_string())?;
    match schema.get("type") {
        None => Ok(()),
        Some(Value::String(t)) if t == "object" => Ok(()),
        Some(other) => Err(format!(
            "the arguments of a call are an object, but the schema's type is {other}"
        )),
    }
}

fn parse_choice(choice: Option<&Value>) -> Result<Option<ToolChoice>, ServerError> {
    let invalid = |message: &str| ServerError::invalid("tool_choice", message);
    let Some(choice) = choice else {
        return Ok(None);
    };
    let parsed = match choice {
        Value::String(s) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ServerError::invalid(
                    "tool_choice",
                    format!(
                        "`tool_choice` `{other}` is not one of \"none\", \"auto\", \"required\" \
                         or a named function"
                    ),
                ))
            }
        },
        Value::Object(o) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid(
                    "a named `tool_choice` must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("a named `tool_choice` needs `function.name`"))?;
            ToolChoice::Named(name.to_string())
        }
        _ => {
            return Err(invalid(
                "`tool_choice` must be \"none\", \"auto\", \"required\" or a named function",
            ))
        }
    };
    Ok(Some(parsed))
}

/// OpenAI's rule for function names.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}
        }})
    }

    fn parse(tools: Value, choice: Value) -> Result<Option<ToolRequest>, ServerError> {
        ToolRequest::parse(Some(&tools), Some(&choice), None)
    }

    #[test]
    fn choices_parse() {
        let t = json!([weather()]);
        assert_eq!(
            parse(t.clone(), Value::Null).unwrap().unwrap().choice,
            ToolChoice::Auto
        );
        assert_eq!(
            parse(t.clone(), json!("required")).unwrap().unwrap().choice,
            ToolChoice::Required
        );
        assert_eq!(
            parse(
                t,
                json!({"type": "function", "function": {"name": "get_weather"}})
            )
            .unwrap()
            .unwrap()
            .choice,
            ToolChoice::Named("get_weather".into())
        );
        assert_eq!(parse(json!([]), json!("none")).unwrap(), None);
    }

    #[test]
    fn bad_tools_are_refused_naming_the_field() {
        let cases = [
            (
                json!([{"type": "function", "function": {"description": "x"}}]),
                Value::Null,
                "tools[0].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                Value::Null,
                "tools[0].function.name",
            ),
            (
                json!([{"type": "code_interpreter"}]),
                Value::Null,
                "tools[0].type",
            ),
            (
                json!([weather(), weather()]),
                Value::Null,
                "tools[1].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": "f",
                         "parameters": {"type": "fish"}}}]),
                Value::Null,
                "tools[0].function.parameters",
            ),
            (
                json!([{"type": "function", "function": {"name": "f",
                         "parameters": {"type": "string"}}}]),
                Value::Null,
                "tools[0].function.parameters",
            ),
            (
                json!([weather()]),
                json!({"type": "function", "function": {"name": "missing"}}),
                "tool_choice",
            ),
            (json!([weather()]), json!("sometimes"), "tool_choice"),
            (json!([]), json!("required"), "tool_choice"),
        ];
        for (tools, choice, param) in cases {
            let e = parse(tools.clone(), choice).expect_err(&tools.to_string());
            assert_eq!(e.param(), Some(param), "{tools}");
        }
    }

    #[test]
    fn forced_grammars() {
        let mut req = parse(json!([weather()]), json!("required"))
            .unwrap()
            .unwrap();
        let Some(OutputConstraint::JsonSchema { schema }) = req.forced_constraint() else {
            panic!("no constraint")
        };
        let schema: Value = serde_json::from_str(&schema).unwrap();
        assert_eq!(schema["minItems"], 1);
        assert!(schema.get("maxItems").is_none());
        assert_eq!(
            schema["items"]["anyOf"][0]["properties"]["name"]["const"],
            "get_weather"
        );
        req.parallel = false;
        let Some(OutputConstraint::JsonSchema { schema }) = req.forced_constraint() else {
            panic!("no constraint")
        };
        assert!(schema.contains("\"maxItems\":1"));
        req.choice = ToolChoice::Named("get_weather".into());
        let Some(OutputConstraint::JsonSchema { schema }) = req.forced_constraint() else {
            panic!("no constraint")
        };
        assert_eq!(
            serde_json::from_str::<Value>(&schema).unwrap(),
            weather()["function"]["parameters"]
        );
        req.choice = ToolChoice::Auto;
        assert_eq!(req.forced_constraint(), None);
    }
}
