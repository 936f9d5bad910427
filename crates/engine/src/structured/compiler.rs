//! Turns an [`OutputConstraint`] into a per-sequence [`TokenConstraint`]: JSON schema to
//! llguidance grammar, grammar to a matcher over the model's vocabulary.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use tessera_protocol::OutputConstraint;
use tessera_tokenizer::Tokenizer;

use crate::error::{EngineError, Result};
use crate::structured::constraint::TokenConstraint;
use tessera_protocol::{DurationHistogram, HistogramSnapshot};

use crate::structured::mask_timing::mask_histogram;
use crate::structured::token_env::token_env;

/// Compiles constraints for one model. Built once at start-up (the token trie is the
/// expensive part) and shared by the server (to check schemas) and the engine.
pub struct GrammarCompiler {
    factory: ParserFactory,
    counters: Arc<DurationHistogram>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field(
                "vocab_size",
                &self.factory.tok_env().tok_trie().vocab_size(),
            )
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// The compiler for a model whose output layer has `model_vocab` logits.
    pub fn new(tokenizer: &Tokenizer, model_vocab: usize) -> Result<Arc<Self>> {
        let env = token_env(tokenizer, model_vocab)?;
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| EngineError::TokenTrie(e.to_string()))?;
        // Errors come back as values; nothing is printed to stderr.
        factory.quiet();
        Ok(Arc::new(Self {
            factory,
            counters: Arc::new(mask_histogram()),
        }))
    }

    /// Compiles `constraint` into a fresh matcher at the start of the output.
    pub fn compile(&self, constraint: &OutputConstraint) -> Result<TokenConstraint> {
        let schema = schema_of(constraint)?;
        let grammar = TopLevelGrammar::from_json_schema(schema);
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| classify(&format!("{e:#}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(classify(&message));
        }
        Ok(TokenConstraint::new(matcher, Arc::clone(&self.counters)))
    }

    /// Masks computed for every sequence this compiler constrained, and their times.
    pub fn mask_times(&self) -> HistogramSnapshot {
        self.counters.snapshot()
    }

    /// Checks that `constraint` compiles (the server's validation), discarding the result.
    pub fn check(&self, constraint: &OutputConstraint) -> Result<()> {
        self.compile(constraint).map(drop)
    }
}

/// The JSON schema a constraint stands for, with the output layout fixed: no free
/// whitespace (a small model would otherwise spend its budget on newlines), separators
/// as Python's `json.dumps` writes them.
fn schema_of(constraint: &OutputConstraint) -> Result<Value> {
    let mut schema = match constraint {
        OutputConstraint::JsonObject => json!({"type": "object"}),
        OutputConstraint::JsonSchema { schema } => serde_json::from_str(schema)
            .map_err(|e| EngineError::SchemaInvalid(format!("not JSON: {e}")))?,
    };
    let layout = json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    });
    match &mut schema {
        Value::Object(map) => {
            if map.contains_key("x-guidance") {
                return Err(EngineError::SchemaUnsupported {
                    keyword: "x-guidance".into(),
                    message: "the output layout is fixed by the server".into(),
                });
            }
            map.insert("x-guidance".into(), layout);
        }
        // `true` accepts anything, `false` nothing; an object schema says the same.
        Value::Bool(true) => schema = json!({"x-guidance": layout}),
        Value::Bool(false) => {
            return Err(EngineError::SchemaInvalid(
                "the schema `false` accepts no output".into(),
            ))
        }
        _ => {
            return Err(EngineError::SchemaInvalid(
                "a schema must be a JSON object or a boolean".into(),
            ))
        }
    }
    Ok(schema)
}

/// An llguidance compile error as ours: an unimplemented keyword is named, anything else
/// is an invalid schema.
fn classify(message: &str) -> EngineError {
    const MARKER: &str = "Unimplemented keys: [";
    if let Some(start) = message.find(MARKER) {
        let rest = &message[start + MARKER.len()..];
        let keys = rest.split(']').next().unwrap_or_default();
        let keyword = keys
            .split(',')
            .map(|k| k.trim().trim_matches('"'))
            .filter(|k| !k.is_empty())
            .collect::<Vec<_>>()
            .join(", ");
        return EngineError::SchemaUnsupported {
            keyword,
            message: message.to_string(),
        };
    }
    EngineError::SchemaInvalid(message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2's tokenizer, from the repository's fixtures, and its compiler.
    fn smollm2_compiler() -> (Tokenizer, Arc<GrammarCompiler>) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tokenizer/smollm2-hf");
        let tokenizer = Tokenizer::from_hf_dir(&dir).expect("fixture tokenizer");
        let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).expect("compiler");
        (tokenizer, compiler)
    }

    #[test]
    fn a_token_outside_the_grammar_is_a_fault_the_sequence_reports() {
        let (tokenizer, compiler) = smollm2_compiler();
        let open = tokenizer.encode("{", false).expect("encode");
        let word = tokenizer.encode("hello", false).expect("encode");
        let mut good = compiler
            .compile(&OutputConstraint::JsonObject)
            .expect("compiles");
        good.advance(open[0]);
        assert_eq!(good.fault(), None);
        let mut bad = compiler
            .compile(&OutputConstraint::JsonObject)
            .expect("compiles");
        bad.advance(word[0]);
        assert!(
            bad.fault().is_some_and(|f| f.contains("refused token")),
            "{:?}",
            bad.fault()
        );
    }

    #[test]
    fn unimplemented_keys_are_named() {
        let e = classify(r#"Unimplemented keys: ["uniqueItems", "contains"]"#);
        assert!(
            matches!(&e, EngineError::SchemaUnsupported { keyword, .. } if keyword == "uniqueItems, contains"),
            "{e:?}"
        );
        assert!(matches!(
            classify("Invalid type: foo"),
            EngineError::SchemaInvalid(_)
        ));
    }

    #[test]
    fn layout_is_added_and_override_refused() {
        let s = schema_of(&OutputConstraint::JsonObject).expect("object");
        assert_eq!(s["x-guidance"]["whitespace_flexible"], json!(false));
        let own = OutputConstraint::JsonSchema {
            schema: r#"{"type":"object","x-guidance":{"lenient":true}}"#.into(),
        };
        assert!(matches!(
            schema_of(&own),
            Err(EngineError::SchemaUnsupported { .. })
        ));
        let not_json = OutputConstraint::JsonSchema { schema: "{".into() };
        assert!(matches!(
            schema_of(&not_json),
            Err(EngineError::SchemaInvalid(_))
        ));
    }
}
