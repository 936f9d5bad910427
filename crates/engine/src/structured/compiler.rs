//! Turns an [`OutputConstraint`] into a per-sequence [`TokenConstraint`]: JSON schema to
//! llguidance grammar, grammar to a matcher over the model's vocabulary.

use std::sync::Arc;

use std::sync::Mutex;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use tessera_protocol::{OutputConstraint, SamplingParams};
use tessera_tokenizer::Tokenizer;

use crate::error::{EngineError, Result};
use crate::structured::constraint::TokenConstraint;
use tessera_protocol::{DurationHistogram, HistogramSnapshot};

use crate::structured::bounds::{check_bounds, GrammarBounds};
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

    /// Compiles `constraint` once, for every sequence of a request: bounds first, then
    /// the grammar, then the mask of the output's first token, so a grammar too complex
    /// to mask (or one whose every first token `params` rules out) is refused here rather
    /// than failing a sequence in the engine. Recurses up to `bounds.max_depth` deep: run
    /// it on a thread with [`compile_stack_bytes`] of stack.
    pub fn prepare(
        &self,
        constraint: &OutputConstraint,
        bounds: &GrammarBounds,
        params: &SamplingParams,
    ) -> Result<PreparedGrammar> {
        check_bounds(constraint, bounds)?;
        let mut matcher = self.matcher(constraint)?;
        let mut first = matcher
            .compute_mask_or_eos()
            .map_err(|e| EngineError::GrammarTooComplex(format!("{e:#}")))?;
        // A thinking block comes before the grammar: its first token is not masked.
        if params.thinking.is_none() {
            rule_out_first_tokens(&mut first, params);
            if first.num_set() == 0 {
                return Err(EngineError::GrammarUnsatisfiable(
                    "no token can begin the output: every token the format allows first is \
                     ruled out by `bad_words`, `allowed_token_ids` or `min_tokens`"
                        .into(),
                ));
            }
        }
        Ok(PreparedGrammar {
            matcher: Mutex::new(matcher),
            counters: Arc::clone(&self.counters),
        })
    }

    /// Compiles `constraint` into a fresh matcher at the start of the output, within
    /// the default bounds (tests and tools; the server prepares once per request).
    pub fn compile(&self, constraint: &OutputConstraint) -> Result<TokenConstraint> {
        self.prepare(
            constraint,
            &GrammarBounds::default(),
            &SamplingParams::default(),
        )
        .map(|p| p.start())
    }

    /// A matcher for `constraint`, at the start of the output.
    fn matcher(&self, constraint: &OutputConstraint) -> Result<Matcher> {
        let (grammar, classify): (_, fn(&str) -> EngineError) = match constraint {
            OutputConstraint::JsonObject | OutputConstraint::JsonSchema { .. } => (
                TopLevelGrammar::from_json_schema(schema_of(constraint)?),
                classify,
            ),
            OutputConstraint::Regex { pattern } => {
                (TopLevelGrammar::from_regex(pattern), invalid_regex)
            }
            OutputConstraint::Choice { choices } => (
                TopLevelGrammar::from_regex(&choice_regex(choices)?),
                invalid_regex,
            ),
            OutputConstraint::Grammar { lark } => {
                (TopLevelGrammar::from_lark(lark.clone()), invalid_grammar)
            }
        };
        // A request's grammar is untrusted input: a panic in the compiler refuses it
        // instead of taking the thread down.
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.factory.create_parser(grammar)
        }))
        .map_err(|_| classify("the grammar compiler failed on this input"))?
        .map_err(|e| classify(&format!("{e:#}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(classify(&message));
        }
        Ok(matcher)
    }

    /// Masks computed for every sequence this compiler constrained, and their times.
    pub fn mask_times(&self) -> HistogramSnapshot {
        self.counters.snapshot()
    }

    /// Checks that `constraint` compiles, discarding the result.
    pub fn check(&self, constraint: &OutputConstraint) -> Result<()> {
        self.compile(constraint).map(drop)
    }
}

/// A constraint compiled for one request, from which each of its sequences starts a
/// matcher of its own.
pub struct PreparedGrammar {
    matcher: Mutex<Matcher>,
    counters: Arc<DurationHistogram>,
}

impl std::fmt::Debug for PreparedGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedGrammar").finish_non_exhaustive()
    }
}

impl PreparedGrammar {
    /// A matcher at the start of the output, for one sequence.
    pub fn start(&self) -> TokenConstraint {
        // The lock is never held across anything that panics.
        let matcher = match self.matcher.lock() {
            Ok(m) => m.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        TokenConstraint::new(matcher, Arc::clone(&self.counters))
    }
}

/// Removes from `mask` the tokens `params` never lets a sequence start with: those
/// outside `allowed_token_ids`, one-token `bad_words`, and with `min_tokens` the tokens
/// it blocks.
fn rule_out_first_tokens(mask: &mut SimpleVob, params: &SamplingParams) {
    if !params.allowed_token_ids.is_empty() {
        let mut allowed = SimpleVob::alloc(mask.len());
        for &t in &params.allowed_token_ids {
            if (t as usize) < mask.len() {
                allowed.allow_token(t);
            }
        }
        mask.and(&allowed);
    }
    let blocked = params
        .bad_words
        .iter()
        .filter(|w| w.len() == 1)
        .flatten()
        .chain(
            params
                .min_tokens_blocked
                .iter()
                .filter(|_| params.min_tokens > 0),
        );
    for &t in blocked {
        if (t as usize) < mask.len() {
            mask.disallow_token(t);
        }
    }
}

/// A regular expression matching exactly the strings of `choices`.
fn choice_regex(choices: &[String]) -> Result<String> {
    if choices.is_empty() {
        return Err(EngineError::GrammarInvalid(
            "a choice needs at least one string".into(),
        ));
    }
    let alternatives: Vec<String> = choices.iter().map(|c| escape_regex(c)).collect();
    Ok(format!("(?:{})", alternatives.join("|")))
}

/// `text` as a regular expression that matches it literally: every character with a
/// meaning in regex syntax gets a backslash.
fn escape_regex(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if r"\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A grammar error.
fn invalid_grammar(message: &str) -> EngineError {
    EngineError::GrammarInvalid(message.to_string())
}

/// A regex error, without the position in and the excerpt of the one-rule grammar that
/// llguidance wraps a regex in (`start: /.../`), which the request never wrote.
fn invalid_regex(message: &str) -> EngineError {
    let message = message.strip_prefix("at 1(8): ").unwrap_or(message);
    let message = message.split("\n   1 | start: /").next().unwrap_or(message);
    EngineError::GrammarInvalid(message.trim_end().to_string())
}

/// The JSON schema a constraint stands for, with the output layout fixed: no free
/// whitespace (a small model would otherwise spend its budget on newlines), separators
/// as Python's `json.dumps` writes them.
fn schema_of(constraint: &OutputConstraint) -> Result<Value> {
    let mut schema = match constraint {
        OutputConstraint::JsonObject => json!({"type": "object"}),
        OutputConstraint::JsonSchema { schema } => serde_json::from_str(schema)
            .map_err(|e| EngineError::SchemaInvalid(format!("not JSON: {e}")))?,
        OutputConstraint::Regex { .. }
        | OutputConstraint::Choice { .. }
        | OutputConstraint::Grammar { .. } => {
            return Err(EngineError::SchemaInvalid(
                "the constraint is not a JSON schema".into(),
            ))
        }
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
            bad.fault()
                .is_some_and(|f| f.message.contains("refused token") && !f.by_request),
            "{:?}",
            bad.fault()
        );
    }

    /// Whether `constraint` lets the model write `text` (as the tokenizer splits it) and
    /// then end: every token passes the mask, and end-of-sequence is allowed after them.
    fn writes_and_ends(
        compiler: &GrammarCompiler,
        tokenizer: &Tokenizer,
        c: &OutputConstraint,
        text: &str,
    ) -> bool {
        let mut constraint = compiler.compile(c).expect("compiles");
        let vocab = tokenizer.vocab_size();
        for token in tokenizer.encode(text, false).expect("encode") {
            let mut logits = vec![0.0f32; vocab];
            constraint.apply_mask(&mut logits);
            if logits[token as usize] == f32::NEG_INFINITY {
                return false;
            }
            constraint.advance(token);
        }
        let mut logits = vec![0.0f32; vocab];
        constraint.apply_mask(&mut logits);
        let ends = tokenizer
            .eos_token_ids()
            .iter()
            .any(|&e| logits.get(e as usize).is_some_and(|l| l.is_finite()));
        ends && constraint.fault().is_none()
    }

    #[test]
    fn regex_choice_and_grammar_admit_their_language_only() {
        let (tokenizer, compiler) = smollm2_compiler();
        let regex = OutputConstraint::Regex {
            pattern: r"[0-9]{3}-[a-z]+".into(),
        };
        assert!(writes_and_ends(&compiler, &tokenizer, &regex, "123-abc"));
        assert!(!writes_and_ends(&compiler, &tokenizer, &regex, "12-abc"));
        assert!(!writes_and_ends(&compiler, &tokenizer, &regex, "123-"));
        let anchored = OutputConstraint::Regex {
            pattern: r"^[0-9]+$".into(),
        };
        // Anchors, as some clients write them, match the whole output as it is anyway.
        assert!(writes_and_ends(&compiler, &tokenizer, &anchored, "123"));
        // Characters with a meaning in regex syntax are taken literally.
        let choice = OutputConstraint::Choice {
            choices: vec!["a.b".into(), "(x)|y".into(), "Paris".into()],
        };
        for ok in ["a.b", "(x)|y", "Paris"] {
            assert!(writes_and_ends(&compiler, &tokenizer, &choice, ok), "{ok}");
        }
        for bad in ["axb", "x", "(x)", "Pari", "Paris!"] {
            assert!(
                !writes_and_ends(&compiler, &tokenizer, &choice, bad),
                "{bad}"
            );
        }
        let grammar = OutputConstraint::Grammar {
            lark: "start: item (\",\" item)*\nitem: \"cat\" | \"dog\"".into(),
        };
        assert!(writes_and_ends(
            &compiler,
            &tokenizer,
            &grammar,
            "cat,dog,cat"
        ));
        assert!(!writes_and_ends(&compiler, &tokenizer, &grammar, "cat,"));
        assert!(!writes_and_ends(&compiler, &tokenizer, &grammar, "cow"));
    }

    #[test]
    fn bad_regexes_and_grammars_are_invalid_grammars() {
        let (_, compiler) = smollm2_compiler();
        for bad in [
            OutputConstraint::Regex {
                pattern: "(unclosed".into(),
            },
            OutputConstraint::Regex {
                pattern: "a{2,1}".into(),
            },
            OutputConstraint::Grammar {
                lark: "start: missing_rule".into(),
            },
            OutputConstraint::Grammar {
                lark: "not a grammar".into(),
            },
            OutputConstraint::Choice { choices: vec![] },
        ] {
            match compiler.check(&bad) {
                Err(EngineError::GrammarInvalid(message)) => {
                    assert!(!message.is_empty());
                    assert!(!message.contains("start: /"), "{message}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
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
    fn prepare(
        compiler: &GrammarCompiler,
        c: &OutputConstraint,
        params: &SamplingParams,
    ) -> Result<PreparedGrammar> {
        compiler.prepare(c, &GrammarBounds::default(), params)
    }

    #[test]
    fn formats_too_complex_to_enforce_are_the_requests_fault() {
        let (tokenizer, compiler) = smollm2_compiler();
        let params = SamplingParams::default();
        // Its first mask is fine; the lexer gives up on the first run of `a`s.
        let repeated = OutputConstraint::Regex {
            pattern: "a{1000}{1000}".into(),
        };
        let prepared = prepare(&compiler, &repeated, &params).expect("prepared");
        let mut c = prepared.start();
        let mut logits = vec![0f32; tokenizer.vocab_size()];
        c.apply_mask(&mut logits);
        let run = tokenizer.encode("aaaa", false).expect("encode");
        assert!(logits[run[0] as usize].is_finite());
        c.advance(run[0]);
        let fault = c.fault().expect("a fault");
        assert!(fault.by_request, "{fault:?}");
        assert!(!fault.message.contains('\n'), "{fault:?}");
        // Right-recursive enough that the parser's rows pass their limit at once.
        let doubly_recursive = OutputConstraint::JsonSchema {
            schema:
                r##"{"$defs": {"a": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/a"}},
                {"type": "array", "items": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}]}]}},
                "$ref": "#/$defs/a"}"##
                    .into(),
        };
        match prepare(&compiler, &doubly_recursive, &params) {
            Err(EngineError::GrammarTooComplex(m) | EngineError::SchemaInvalid(m)) => {
                assert!(!m.is_empty())
            }
            Ok(prepared) => {
                // Or at its first tokens.
                let mut c = prepared.start();
                for t in tokenizer.encode("[[[[", false).expect("encode") {
                    c.advance(t);
                }
                assert!(c.fault().is_none_or(|f| f.by_request), "{:?}", c.fault());
            }
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_format_whose_first_tokens_the_request_rules_out_is_unsatisfiable() {
        let (tokenizer, compiler) = smollm2_compiler();
        let digits = OutputConstraint::Regex {
            pattern: "[0-9]".into(),
        };
        let all_digits: Vec<Vec<u32>> = (0..10)
            .map(|d| tokenizer.encode(&d.to_string(), false).expect("encode"))
            .collect();
        assert!(all_digits.iter().all(|w| w.len() == 1));
        let banned = SamplingParams {
            bad_words: all_digits.clone(),
            ..SamplingParams::default()
        };
        assert!(matches!(
            prepare(&compiler, &digits, &banned),
            Err(EngineError::GrammarUnsatisfiable(_))
        ));
        let allowed_elsewhere = SamplingParams {
            allowed_token_ids: tokenizer.encode("hello", false).expect("encode"),
            ..SamplingParams::default()
        };
        assert!(matches!(
            prepare(&compiler, &digits, &allowed_elsewhere),
            Err(EngineError::GrammarUnsatisfiable(_))
        ));
        // One digit left: satisfiable.
        let most = SamplingParams {
            bad_words: all_digits[1..].to_vec(),
            ..SamplingParams::default()
        };
        assert!(prepare(&compiler, &digits, &most).is_ok());
        // A thinking block comes first: the grammar's first token is not the output's.
        let thinking = SamplingParams {
            thinking: Some(tessera_protocol::ThinkingTags {
                open: None,
                close: "</think>".into(),
                starts_open: true,
            }),
            ..banned
        };
        assert!(prepare(&compiler, &digits, &thinking).is_ok());
    }

    #[test]
    fn each_sequence_starts_its_own_matcher_from_one_compilation() {
        let (tokenizer, compiler) = smollm2_compiler();
        let c = OutputConstraint::Choice {
            choices: vec!["yes".into(), "no".into()],
        };
        let prepared = prepare(&compiler, &c, &SamplingParams::default()).expect("prepared");
        let mut a = prepared.start();
        let mut b = prepared.start();
        let yes = tokenizer.encode("yes", false).expect("encode");
        for &t in &yes {
            a.advance(t);
        }
        assert!(a.is_complete());
        assert!(!b.is_complete(), "b did not move with a");
        let no = tokenizer.encode("no", false).expect("encode");
        for &t in &no {
            b.advance(t);
        }
        assert!(b.is_complete() && a.fault().is_none() && b.fault().is_none());
    }

    #[test]
    fn bounds_are_checked_before_compiling() {
        let (_, compiler) = smollm2_compiler();
        let mut g = String::from("start: r0\n");
        for i in 0..3000 {
            g.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
        }
        let deep = OutputConstraint::Grammar { lark: g };
        // On this test thread's small stack, compiling it would overflow.
        assert!(matches!(
            prepare(&compiler, &deep, &SamplingParams::default()),
            Err(EngineError::GrammarTooLarge(_))
        ));
    }
}
