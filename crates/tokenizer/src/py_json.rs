//! `tojson` as Hugging Face's chat-template environment defines it: Python's
//! `json.dumps(value, ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)`.
//!
//! minijinja's own `tojson` escapes `<`, `>`, `&` and `'` for HTML and uses different
//! spacing; a tool schema rendered that way gives different prompt tokens than the model
//! was trained on, so the filter is replaced.

use std::io;

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};

/// Item and key separators, as Python's `separators=(item, key)`.
#[derive(Debug, Clone)]
struct Separators {
    item: String,
    key: String,
}

/// The `tojson` filter: `value | tojson(indent=None, ensure_ascii=False, sort_keys=False,
/// separators=None)`; `indent` may also be given positionally.
pub(crate) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent: Option<String> = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                let n = usize::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    )
                })?;
                Some(" ".repeat(n))
            }
        },
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) if pair.len() == 2 => Some(Separators {
            item: pair[0].clone(),
            key: pair[1].clone(),
        }),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair (item, key)",
            ))
        }
        None => None,
    };
    kwargs.assert_all_used()?;

    let mut json = serde_json::to_value(value).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value cannot be serialized",
        )
        .with_source(e)
    })?;
    if sort_keys {
        sort_json_keys(&mut json);
    }
    let text = dumps(&json, indent.as_deref(), separators).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "tojson: serialization failed").with_source(e)
    })?;
    let text = if ensure_ascii {
        escape_non_ascii(&text)
    } else {
        text
    };
    Ok(Value::from_safe_string(text))
}

/// Python's `json.dumps` layout: without indent, `", "` and `": "`; with indent, `","`
/// plus newline and `": "`.
fn dumps(
    json: &serde_json::Value,
    indent: Option<&str>,
    separators: Option<Separators>,
) -> io::Result<String> {
    let mut out = Vec::new();
    match (indent, separators) {
        (Some(indent), None) => {
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                PrettyFormatter::with_indent(indent.as_bytes()),
            );
            json.serialize(&mut ser).map_err(io::Error::other)?;
        }
        (indent, separators) => {
            let separators = separators.unwrap_or_else(|| Separators {
                item: if indent.is_some() {
                    ",".into()
                } else {
                    ", ".into()
                },
                key: ": ".into(),
            });
            let formatter = PythonFormatter {
                separators,
                indent: indent.map(str::to_string),
                depth: 0,
                has_value: false,
            };
            let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
            json.serialize(&mut ser).map_err(io::Error::other)?;
        }
    }
    String::from_utf8(out).map_err(io::Error::other)
}

fn sort_json_keys(json: &mut serde_json::Value) {
    match json {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = std::mem::take(map).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (key, mut value) in entries {
                sort_json_keys(&mut value);
                map.insert(key, value);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(sort_json_keys),
        _ => {}
    }
}

/// `ensure_ascii=True`: every non-ASCII character as `\uXXXX` (surrogate pairs above the
/// BMP). Non-ASCII only occurs inside strings, so escaping the whole text is safe.
fn escape_non_ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// A formatter with caller-chosen separators and optional indentation.
struct PythonFormatter {
    separators: Separators,
    indent: Option<String>,
    depth: usize,
    has_value: bool,
}

impl PythonFormatter {
    fn newline<W: ?Sized + io::Write>(&self, writer: &mut W) -> io::Result<()> {
        if let Some(indent) = &self.indent {
            writer.write_all(b"\n")?;
            for _ in 0..self.depth {
                writer.write_all(indent.as_bytes())?;
            }
        }
        Ok(())
    }

    fn begin_item<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if !first {
            writer.write_all(self.separators.item.as_bytes())?;
        }
        self.newline(writer)
    }

    fn end_container<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        close: &[u8],
    ) -> io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.newline(writer)?;
        }
        self.has_value = true;
        writer.write_all(close)
    }
}

impl Formatter for PythonFormatter {
    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        writer.write_all(b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.end_container(writer, b"]")
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.begin_item(writer, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        writer.write_all(b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.end_container(writer, b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.begin_item(writer, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(self.separators.key.as_bytes())
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;

    fn render(expr: &str, value: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        env.render_str(
            expr,
            minijinja::context! { v => minijinja::value::Serde(value) },
        )
        .unwrap()
    }

    #[test]
    fn matches_python_json_dumps() {
        let v = serde_json::json!({"name": "get_weather", "b": [1, 2.5, true, null], "e": {}, "s": "<a&b> é"});
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            render("{{ v | tojson }}", v.clone()),
            r#"{"name": "get_weather", "b": [1, 2.5, true, null], "e": {}, "s": "<a&b> é"}"#
        );
        // json.dumps(v, ensure_ascii=False, indent=2)
        assert_eq!(
            render("{{ v | tojson(indent=2) }}", v.clone()),
            "{\n  \"name\": \"get_weather\",\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"e\": {},\n  \"s\": \"<a&b> é\"\n}"
        );
        // json.dumps(v, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        assert_eq!(
            render(
                "{{ v | tojson(sort_keys=true, ensure_ascii=true, separators=[',', ':']) }}",
                v
            ),
            r#"{"b":[1,2.5,true,null],"e":{},"name":"get_weather","s":"<a&b> \u00e9"}"#
        );
    }
}
