//! Small builders of JSON schema values the document shares with its parts.

use serde_json::{json, Value};

/// `base` (an object) with the properties of `extra` added.
pub fn with_properties(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

/// A reference to the component schema `name`.
pub fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}
