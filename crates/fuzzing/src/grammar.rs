//! Structured output formats, deep and wide: schemas and grammars given as text, or
//! generated from a few bytes into `$ref` chains, nested objects, rule chains, nested
//! groups and wide alternations of any depth. Each is compiled as the server compiles a
//! request's format (bounds first, on a compile thread with the stack the bounds call
//! for), and must compile or be refused with a client error: never a crash (a stack
//! overflow aborts the fuzzer), never another kind of error.

use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};
use tessera_engine::structured::{spawn_prepare, GrammarBounds};
use tessera_engine::{EngineError, GrammarCompiler};
use tessera_protocol::{OutputConstraint, SamplingParams};

use crate::model::tokenizer;

fn compiler() -> Arc<GrammarCompiler> {
    static COMPILER: OnceLock<Arc<GrammarCompiler>> = OnceLock::new();
    let compiler = COMPILER.get_or_init(|| {
        let tokenizer = tokenizer();
        match GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()) {
            Ok(c) => c,
            Err(e) => panic!("cannot build the grammar compiler: {e}"),
        }
    });
    Arc::clone(compiler)
}

/// Reads `data` as a format: its first byte says how (see the module docs).
fn constraint(data: &[u8]) -> Option<OutputConstraint> {
    let (&mode, rest) = data.split_first()?;
    let text = || String::from_utf8_lossy(rest).into_owned();
    let number = |i: usize| rest.get(i).copied().unwrap_or(0) as usize;
    // Depth up to 65535, width up to 255: far past any bound.
    let depth = number(0) << 8 | number(1);
    let width = number(2).max(1);
    let shape = number(3);
    Some(match mode % 5 {
        0 => OutputConstraint::JsonSchema { schema: text() },
        1 => OutputConstraint::Grammar { lark: text() },
        2 => OutputConstraint::JsonSchema {
            schema: deep_schema(depth, width, shape).to_string(),
        },
        3 => OutputConstraint::Grammar {
            lark: deep_grammar(depth, width, shape),
        },
        _ => OutputConstraint::Regex { pattern: text() },
    })
}

/// A schema `depth` deep and `width` wide, of one of four shapes.
fn deep_schema(depth: usize, width: usize, shape: usize) -> Value {
    let mut defs = serde_json::Map::new();
    let link = |i: usize| json!({"$ref": format!("#/$defs/d{i}")});
    for i in 0..depth.min(20_000) {
        let next = if i + 1 < depth {
            link(i + 1)
        } else {
            json!({"type": "integer"})
        };
        let def = match shape % 4 {
            // A bare `$ref` chain.
            0 => next,
            // Objects with `width` properties, one of them the next link.
            1 => {
                let mut props: serde_json::Map<String, Value> = (0..width)
                    .map(|w| (format!("p{w}"), json!({"type": "string"})))
                    .collect();
                props.insert("next".into(), next);
                json!({"type": "object", "properties": props})
            }
            // Alternatives of `width` branches, each leading on.
            2 => json!({"anyOf": (0..width).map(|_| next.clone()).collect::<Vec<_>>()}),
            // Arrays of the next link, and back to the first (a cycle).
            _ => json!({"type": "array", "items": [next, link(0)]}),
        };
        defs.insert(format!("d{i}"), def);
    }
    json!({"$ref": "#/$defs/d0", "$defs": defs})
}

/// A Lark grammar `depth` deep and `width` wide, of one of four shapes.
fn deep_grammar(depth: usize, width: usize, shape: usize) -> String {
    let depth = depth.min(20_000);
    match shape % 4 {
        // A rule chain.
        0 => {
            let mut g = String::from("start: r0\n");
            for i in 0..depth {
                g.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
            }
            g.push_str(&format!("r{depth}: \"b\"\n"));
            g
        }
        // Nested groups.
        1 => format!("start: {}\"a\"{}\n", "(".repeat(depth), ")*".repeat(depth)),
        // Each rule a choice of `width` rules of the next level.
        2 => {
            let mut g = String::from("start: l0_0\n");
            for i in 0..depth {
                for w in 0..width {
                    let alts: Vec<String> = (0..width).map(|v| format!("l{}_{v}", i + 1)).collect();
                    g.push_str(&format!("l{i}_{w}: \"{w}\" ({})\n", alts.join(" | ")));
                }
            }
            for v in 0..width {
                g.push_str(&format!("l{depth}_{v}: \"z\"\n"));
            }
            g
        }
        // A rule repeated `width` times per level.
        _ => {
            let mut g = String::from("start: r0\n");
            for i in 0..depth {
                let body = vec![format!("r{}", i + 1); width].join(" ");
                g.push_str(&format!("r{i}: {body}\n"));
            }
            g.push_str(&format!("r{depth}: \"x\"\n"));
            g
        }
    }
}

/// Errors a format may be refused with: all the client's.
fn is_client_error(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::SchemaInvalid(_)
            | EngineError::SchemaUnsupported { .. }
            | EngineError::GrammarInvalid(_)
            | EngineError::GrammarTooLarge(_)
            | EngineError::GrammarTooComplex(_)
            | EngineError::GrammarUnsatisfiable(_)
    )
}

/// A structured output format, compiled as the server compiles one.
pub fn structured_output(data: &[u8]) {
    let Some(constraint) = constraint(data) else {
        return;
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let started = spawn_prepare(
        compiler(),
        constraint,
        GrammarBounds::default(),
        SamplingParams::default(),
        move |result| {
            let _ = tx.send(result.map(drop));
        },
    );
    if let Err(e) = started {
        panic!("cannot start a compile thread: {e}");
    }
    match rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) if is_client_error(&e) => {}
        Ok(Err(e)) => panic!("a format failed with an error that is not the client's: {e}"),
        Err(_) => panic!("the compile thread ended without an answer (it panicked)"),
    }
}
