//! A config file's TOML values as the flag values they stand for: a string, number or
//! boolean as it would be typed, a list for a flag given several times, and for a key
//! that takes a JSON object (vLLM's `--speculative-config`) a TOML table as its JSON.

/// Keys whose value is a JSON object: a config file may give them as a TOML table
/// (`[key]` or `key = { ... }`) instead of a JSON string.
const JSON_OBJECT_KEYS: &[&str] = &["speculative_config"];

/// The values of file key `name` (`item`): one, or several where its flag takes
/// `multiple`; why not, otherwise.
pub(crate) fn flag_values(
    name: &str,
    item: &toml_edit::Item,
    multiple: bool,
) -> Result<Vec<String>, String> {
    if JSON_OBJECT_KEYS.contains(&name) {
        if let Some(json) = table_as_json(item) {
            return Ok(vec![json?.to_string()]);
        }
    }
    let value = item
        .as_value()
        .ok_or_else(|| "expected a value, not a table".to_string())?;
    match value.as_array() {
        Some(_) if !multiple => return Err("takes one value, not a list".into()),
        Some(array) => array.iter().map(scalar).collect::<Option<Vec<_>>>(),
        None => scalar(value).map(|v| vec![v]),
    }
    .ok_or_else(|| "expected a string, number or boolean".into())
}

/// `item` as a JSON object, when it is a table (`[key]` or `key = { ... }`).
fn table_as_json(item: &toml_edit::Item) -> Option<Result<serde_json::Value, String>> {
    let pairs: Vec<(&str, &toml_edit::Value)> = match item {
        toml_edit::Item::Table(t) => {
            let mut pairs = Vec::new();
            for (k, v) in t.iter() {
                match v.as_value() {
                    Some(v) => pairs.push((k, v)),
                    None => return Some(Err(format!("`{k}`: expected a value, not a table"))),
                }
            }
            pairs
        }
        toml_edit::Item::Value(toml_edit::Value::InlineTable(t)) => t.iter().collect(),
        _ => return None,
    };
    let mut object = serde_json::Map::new();
    for (k, v) in pairs {
        match toml_to_json(v) {
            Some(v) => object.insert(k.to_string(), v),
            None => return Some(Err(format!("`{k}`: a date has no JSON form"))),
        };
    }
    Some(Ok(serde_json::Value::Object(object)))
}

fn toml_to_json(v: &toml_edit::Value) -> Option<serde_json::Value> {
    use toml_edit::Value as T;
    Some(match v {
        T::String(s) => serde_json::Value::from(s.value().as_str()),
        T::Integer(i) => serde_json::Value::from(*i.value()),
        T::Float(f) => serde_json::Value::from(*f.value()),
        T::Boolean(b) => serde_json::Value::from(*b.value()),
        T::Array(a) => serde_json::Value::Array(a.iter().map(toml_to_json).collect::<Option<_>>()?),
        T::InlineTable(t) => serde_json::Value::Object(
            t.iter()
                .map(|(k, v)| Some((k.to_string(), toml_to_json(v)?)))
                .collect::<Option<_>>()?,
        ),
        T::Datetime(_) => return None,
    })
}

fn scalar(v: &toml_edit::Value) -> Option<String> {
    if let Some(s) = v.as_str() {
        Some(s.to_string())
    } else if let Some(i) = v.as_integer() {
        Some(i.to_string())
    } else if let Some(f) = v.as_float() {
        Some(f.to_string())
    } else {
        v.as_bool().map(|b| b.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The values of `key` in the TOML `text`.
    fn values(text: &str, key: &str, multiple: bool) -> Result<Vec<String>, String> {
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        flag_values(key, &doc[key], multiple)
    }

    #[test]
    fn speculative_config_is_a_section_an_inline_table_or_a_json_string() {
        let json = |text: &str| {
            let v = values(text, "speculative_config", false).unwrap();
            serde_json::from_str::<serde_json::Value>(&v[0]).unwrap()
        };
        let want = serde_json::json!({"method": "mtp", "num_speculative_tokens": 2});
        let section = "[speculative_config]\nmethod = \"mtp\"\nnum_speculative_tokens = 2\n";
        assert_eq!(json(section), want);
        let inline = "speculative_config = { method = \"mtp\", num_speculative_tokens = 2 }\n";
        assert_eq!(json(inline), want);
        let string =
            "speculative_config = '{\"method\": \"mtp\", \"num_speculative_tokens\": 2}'\n";
        assert_eq!(json(string), want);
        let dated = "speculative_config = { method = \"mtp\", when = 2026-11-28 }\n";
        let err = values(dated, "speculative_config", false).unwrap_err();
        assert!(err.contains("`when`") && err.contains("date"), "{err}");
    }

    #[test]
    fn other_keys_take_scalars_and_lists_where_their_flag_repeats() {
        assert_eq!(values("port = 9000\n", "port", false).unwrap(), ["9000"]);
        let list = "api_key = [\"a\", \"b\"]\n";
        assert_eq!(values(list, "api_key", true).unwrap(), ["a", "b"]);
        assert!(values(list, "api_key", false)
            .unwrap_err()
            .contains("not a list"));
        let table = "[port]\nvalue = 1\n";
        assert!(values(table, "port", false)
            .unwrap_err()
            .contains("not a table"));
    }
}
