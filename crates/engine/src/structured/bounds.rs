//! Bounds on a constraint's size and depth, checked before it reaches the grammar
//! compiler. llguidance compiles JSON schemas and Lark grammars by recursion: a `$ref`
//! chain a few hundred long, or a rule chain of a few hundred rules, overflows a thread's
//! stack, which aborts the process (an overflow cannot be caught). Everything a request
//! can ask for is measured here first, by code that recurses at most `max_depth` deep
//! itself, and the compiler then runs on a thread whose stack is sized for that depth
//! (`structured::compile_pool`).
//!
//! Depth is what the compiler's recursion follows: for a schema, each nested JSON value
//! and each local `$ref` hop (a reference back into a schema being expanded is a cycle,
//! which the compiler resolves by name, so it adds nothing); for a grammar, each rule
//! reference and each parenthesised group inside a rule.

use std::collections::HashMap;

use serde_json::Value;
use tessera_protocol::OutputConstraint;

use crate::error::{EngineError, Result};

/// How large and how deep a constraint may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrammarBounds {
    /// Longest schema, grammar, regex or list of choices, in bytes.
    pub max_bytes: usize,
    /// Deepest nesting the compiler may recurse through.
    pub max_depth: usize,
}

impl Default for GrammarBounds {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_GRAMMAR_BYTES,
            max_depth: DEFAULT_MAX_GRAMMAR_DEPTH,
        }
    }
}

/// 256 KiB: a schema of some thousand properties, far more than any tool or response
/// format needs.
pub const DEFAULT_MAX_GRAMMAR_BYTES: usize = 256 << 10;

/// 128 levels: a JSON schema as deep as a JSON body may be (serde_json stops at 128),
/// and a grammar with rule chains of that length.
pub const DEFAULT_MAX_GRAMMAR_DEPTH: usize = 128;

/// Checks `constraint` against `bounds`; a refusal names the bound.
pub fn check_bounds(constraint: &OutputConstraint, bounds: &GrammarBounds) -> Result<()> {
    let bytes = match constraint {
        OutputConstraint::JsonObject => 0,
        OutputConstraint::JsonSchema { schema } => schema.len(),
        OutputConstraint::Regex { pattern } => pattern.len(),
        OutputConstraint::Choice { choices } => choices.iter().map(|c| c.len() + 1).sum(),
        OutputConstraint::Grammar { lark } => lark.len(),
    };
    if bytes > bounds.max_bytes {
        return Err(EngineError::GrammarTooLarge(format!(
            "it is {bytes} bytes, more than the limit of {} bytes",
            bounds.max_bytes
        )));
    }
    let depth = match constraint {
        OutputConstraint::JsonSchema { schema } => {
            let value: Value = serde_json::from_str(schema)
                .map_err(|e| EngineError::SchemaInvalid(format!("not JSON: {e}")))?;
            SchemaDepth::new(&value, bounds.max_depth).measure()
        }
        OutputConstraint::Grammar { lark } => {
            let (lark, schemas) = embedded_schemas(lark);
            schemas
                .iter()
                .try_for_each(|s| SchemaDepth::new(s, bounds.max_depth).measure().map(drop))
                .and_then(|()| LarkDepth::new(&lark, bounds.max_depth).measure())
        }
        OutputConstraint::JsonObject | OutputConstraint::Regex { .. } => Ok(0),
        // A choice is one flat alternation.
        OutputConstraint::Choice { .. } => Ok(1),
    };
    depth.map(drop).map_err(|TooDeep| {
        EngineError::GrammarTooLarge(format!(
            "it nests more than {} levels deep (counting nested values, `$ref` hops and \
             rule references)",
            bounds.max_depth
        ))
    })
}

/// The nesting passed the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TooDeep;

/// Height of a schema: nested values, and local `$ref`s followed to their targets. Every
/// object and array is measured once (by address), whichever path or `$ref` spelling
/// reaches it, so the walk is linear in the schema's size.
struct SchemaDepth<'a> {
    root: &'a Value,
    limit: usize,
    /// Heights of containers already measured (`None`: being measured; a path back to
    /// it is a cycle).
    heights: HashMap<usize, Option<usize>>,
}

impl<'a> SchemaDepth<'a> {
    fn new(root: &'a Value, limit: usize) -> Self {
        Self {
            root,
            limit,
            heights: HashMap::new(),
        }
    }

    fn measure(mut self) -> Result<usize, TooDeep> {
        self.height(self.root, 0)
    }

    /// Height of `value` found at `depth`; recursion stops past the limit.
    fn height(&mut self, value: &'a Value, depth: usize) -> Result<usize, TooDeep> {
        if depth > self.limit {
            return Err(TooDeep);
        }
        if !matches!(value, Value::Object(_) | Value::Array(_)) {
            return Ok(0);
        }
        let key = value as *const Value as usize;
        match self.heights.get(&key) {
            // A path back into a schema being measured: the compiler refers back by name.
            Some(None) => return Ok(0),
            Some(Some(h)) if depth + h > self.limit => return Err(TooDeep),
            Some(Some(h)) => return Ok(*h),
            None => {}
        }
        self.heights.insert(key, None);
        let mut below = 0;
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let h = match (key.as_str(), child) {
                        ("$ref", Value::String(target)) => self.reference(target, depth)?,
                        _ => self.height(child, depth + 1)?,
                    };
                    below = below.max(h);
                }
            }
            Value::Array(items) => {
                for child in items {
                    below = below.max(self.height(child, depth + 1)?);
                }
            }
            _ => {}
        }
        let h = below + 1;
        self.heights.insert(key, Some(h));
        Ok(h)
    }

    /// Height added by following `$ref: target` from `depth`. Only local references
    /// can be followed; others are the compiler's to refuse.
    fn reference(&mut self, target: &str, depth: usize) -> Result<usize, TooDeep> {
        match target.strip_prefix('#').and_then(|p| self.root.pointer(p)) {
            Some(node) => self.height(node, depth + 1).map(|h| h + 1),
            None => Ok(0),
        }
    }
}

/// Height of a Lark grammar: from `start`, through rule references and parenthesised
/// groups. A light scan, not a parser: strings, regular expressions and comments are
/// skipped, and whatever the scan cannot read is left to the compiler to refuse.
struct LarkDepth<'a> {
    rules: HashMap<&'a str, Vec<Item<'a>>>,
    limit: usize,
    heights: HashMap<&'a str, Option<usize>>,
}

/// What a rule's body refers to, with the group nesting around it.
#[derive(Debug, Clone, Copy)]
struct Item<'a> {
    name: &'a str,
    /// Parentheses and brackets open around the reference.
    groups: usize,
}

impl<'a> LarkDepth<'a> {
    fn new(source: &'a str, limit: usize) -> Self {
        Self {
            rules: lark_rules(source),
            limit,
            heights: HashMap::new(),
        }
    }

    fn measure(mut self) -> Result<usize, TooDeep> {
        // Every rule counts, not just those reachable from `start`: the compiler reads
        // them all.
        let names: Vec<&'a str> = self.rules.keys().copied().collect();
        let mut deepest = 0;
        for name in names {
            deepest = deepest.max(self.height(name, 0)?);
        }
        Ok(deepest)
    }

    fn height(&mut self, name: &'a str, depth: usize) -> Result<usize, TooDeep> {
        if depth > self.limit {
            return Err(TooDeep);
        }
        match self.heights.get(name) {
            Some(None) => return Ok(0),
            Some(Some(h)) => {
                return match depth + h > self.limit {
                    true => Err(TooDeep),
                    false => Ok(*h),
                }
            }
            None => {}
        }
        let Some(items) = self.rules.get(name).cloned() else {
            return Ok(0);
        };
        self.heights.insert(name, None);
        let mut below = 0;
        for item in items {
            if depth + 1 + item.groups > self.limit {
                return Err(TooDeep);
            }
            let h = match item.name {
                "" => 0,
                name => self.height(name, depth + 1 + item.groups)?,
            };
            below = below.max(h + item.groups);
        }
        let h = below + 1;
        self.heights.insert(name, Some(h));
        Ok(h)
    }
}

/// The JSON schemas a grammar embeds (`%json { ... }`, compiled by the JSON schema
/// compiler) and the grammar with each replaced by a placeholder. A schema that does
/// not parse is left in place for the compiler to refuse.
fn embedded_schemas(source: &str) -> (String, Vec<Value>) {
    const DIRECTIVE: &str = "%json";
    let mut rest = source;
    let mut out = String::with_capacity(source.len());
    let mut schemas = Vec::new();
    while let Some(at) = rest.find(DIRECTIVE) {
        let (before, after) = rest.split_at(at + DIRECTIVE.len());
        out.push_str(before);
        let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) => {
                let used = values.byte_offset();
                schemas.push(value);
                out.push_str(" {}");
                rest = &after[used..];
            }
            _ => rest = after,
        }
    }
    out.push_str(rest);
    (out, schemas)
}

/// The rules (and terminals) of a Lark grammar with what each body refers to. A rule
/// starts on a line `name:` (with Lark's `?`, `!` or `_` prefixes and `.priority`);
/// lines that start with `|` or whitespace continue it.
fn lark_rules(source: &str) -> HashMap<&str, Vec<Item<'_>>> {
    let mut rules: HashMap<&str, Vec<Item<'_>>> = HashMap::new();
    let mut current: Option<&str> = None;
    for line in source.lines() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with("//") {
            continue;
        }
        if trimmed.starts_with('%') {
            current = None;
            continue;
        }
        let continues = trimmed.starts_with('|') || line.len() != trimmed.len();
        let body = if continues {
            trimmed
        } else {
            match rule_head(trimmed) {
                Some((name, body)) => {
                    current = Some(name);
                    body
                }
                None => {
                    current = None;
                    continue;
                }
            }
        };
        if let Some(name) = current {
            let items = rules.entry(name).or_default();
            scan_body(body, items);
        }
    }
    rules
}

/// `name: body` (also `?name.2: body`): the name and the body.
fn rule_head(line: &str) -> Option<(&str, &str)> {
    let start = line.trim_start_matches(['?', '!']);
    let end = start
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(start.len());
    let name = &start[..end];
    if name.is_empty() {
        return None;
    }
    let rest = start[end..].trim_start();
    // An optional priority: `.2`, `.-1`.
    let rest = match rest.strip_prefix('.') {
        Some(p) => p.trim_start_matches(|c: char| c.is_ascii_digit() || c == '-'),
        None => rest,
    };
    let body = rest.trim_start().strip_prefix(':')?;
    Some((name, body))
}

/// The references and group depths of one line of a rule body.
fn scan_body<'a>(body: &'a str, items: &mut Vec<Item<'a>>) {
    let bytes = body.as_bytes();
    let mut groups = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => break,
            b'"' | b'/' => i = skip_quoted(bytes, i),
            b'(' | b'[' => {
                groups += 1;
                // A group with nothing in it still costs a level.
                items.push(Item { name: "", groups });
                i += 1;
            }
            b')' | b']' => {
                groups = groups.saturating_sub(1);
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                items.push(Item {
                    name: &body[start..i],
                    groups,
                });
            }
            _ => i += 1,
        }
    }
}

/// The index just past the string or regex literal that opens at `start`.
fn skip_quoted(bytes: &[u8], start: usize) -> usize {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(depth: usize) -> GrammarBounds {
        GrammarBounds {
            max_bytes: 1 << 20,
            max_depth: depth,
        }
    }

    /// A schema whose `$defs` chain `n` references deep.
    fn ref_chain(n: usize) -> String {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = if i + 1 < n {
                serde_json::json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}})
            } else {
                serde_json::json!({"type": "integer"})
            };
            defs.insert(format!("d{i}"), next);
        }
        serde_json::json!({"$ref": "#/$defs/d0", "$defs": defs}).to_string()
    }

    fn rule_chain(n: usize) -> String {
        let mut g = String::from("start: r0\n");
        for i in 0..n {
            if i + 1 < n {
                g.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
            } else {
                g.push_str(&format!("r{i}: \"a\"\n"));
            }
        }
        g
    }

    fn check(c: OutputConstraint, depth: usize) -> Result<()> {
        check_bounds(&c, &bounds(depth))
    }

    #[test]
    fn ref_chains_are_measured_through_their_targets() {
        let schema = |n| OutputConstraint::JsonSchema {
            schema: ref_chain(n),
        };
        assert!(check(schema(10), 128).is_ok());
        // Each hop is a definition, its `properties` and `x`: three levels.
        assert!(check(schema(50), 128).is_err());
        assert!(matches!(
            check(schema(50), 128),
            Err(EngineError::GrammarTooLarge(m)) if m.contains("128 levels")
        ));
    }

    #[test]
    fn recursive_schemas_are_not_too_deep() {
        let tree = serde_json::json!({
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                "left": {"$ref": "#/$defs/node"}, "right": {"$ref": "#/$defs/node"}}}},
            "$ref": "#/$defs/node"
        });
        let c = OutputConstraint::JsonSchema {
            schema: tree.to_string(),
        };
        assert!(check(c, 16).is_ok());
    }

    #[test]
    fn many_wide_references_to_one_target_are_measured_once() {
        // 2000 properties each referring to the same deep-ish definition: wide, not deep.
        let mut props = serde_json::Map::new();
        for i in 0..2000 {
            props.insert(format!("p{i}"), serde_json::json!({"$ref": "#/$defs/d0"}));
        }
        let mut schema: Value = serde_json::from_str(&ref_chain(5)).unwrap_or_default();
        schema["properties"] = Value::Object(props);
        let c = OutputConstraint::JsonSchema {
            schema: schema.to_string(),
        };
        assert!(check(c, 64).is_ok());
    }

    #[test]
    fn lark_rule_chains_and_groups_are_measured() {
        let g = |s: String| OutputConstraint::Grammar { lark: s };
        assert!(check(g(rule_chain(50)), 128).is_ok());
        assert!(check(g(rule_chain(200)), 128).is_err());
        let nested = format!("start: {}\"a\"{}", "(".repeat(200), ")".repeat(200));
        assert!(check(g(nested), 128).is_err());
        // A schema inside the grammar is measured as a schema.
        let embedded = |n| g(format!("start: \"x\" obj\nobj: %json {}\n", ref_chain(n)));
        assert!(check(embedded(10), 128).is_ok());
        assert!(check(embedded(50), 128).is_err());
        let shallow = "start: item (\",\" item)*\nitem: \"cat\" | \"dog\"\n  | \"(((\" // ((((\n";
        assert!(check(g(shallow.to_string()), 8).is_ok());
        // Recursion is by name, not depth.
        let recursive = "start: expr\nexpr: term | expr \"+\" term\nterm: \"1\" | \"(\" expr \")\"";
        assert!(check(g(recursive.to_string()), 8).is_ok());
    }

    #[test]
    fn sizes_are_bounded_for_every_kind() {
        let small = GrammarBounds {
            max_bytes: 100,
            max_depth: 128,
        };
        for c in [
            OutputConstraint::Regex {
                pattern: "a".repeat(101),
            },
            OutputConstraint::Choice {
                choices: vec!["b".repeat(60), "c".repeat(60)],
            },
            OutputConstraint::Grammar {
                lark: format!("start: \"{}\"", "d".repeat(100)),
            },
            OutputConstraint::JsonSchema {
                schema: format!("{{\"description\": \"{}\"}}", "e".repeat(100)),
            },
        ] {
            assert!(
                matches!(check_bounds(&c, &small), Err(EngineError::GrammarTooLarge(m)) if m.contains("100 bytes")),
                "{c:?}"
            );
        }
        assert!(check_bounds(&OutputConstraint::JsonObject, &small).is_ok());
    }
}
