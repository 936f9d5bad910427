//! Request bodies through the server's own JSON parsing and validation, against the real
//! tokenizer and chat template: either a request fit to schedule or a client error.

use std::sync::OnceLock;

use axum::http::StatusCode;
use tessera_engine::GrammarCompiler;
use tessera_server::api::chat::request::ChatRequest;
use tessera_server::api::completions::request::CompletionRequest;
use tessera_server::api::error::ServerError;
use tessera_server::api::models::ServedNames;
use tessera_server::api::params::grammar::GrammarService;
use tessera_server::api::params::limits::RequestLimits;
use tessera_server::api::valid_request::{ValidRequest, ValidationContext};
use tessera_server::serve::json_body::parse_json_body;

use crate::model::{runtime, tokenizer};

/// The model name the seeds use.
pub const SERVED_MODEL: &str = "smollm2";
const MAX_MODEL_LEN: usize = 2048;

fn context() -> &'static ValidationContext {
    static CONTEXT: OnceLock<ValidationContext> = OnceLock::new();
    CONTEXT.get_or_init(|| {
        let tokenizer = tokenizer();
        // The real compiler, so `response_format` schemas are fuzzed through it too.
        let grammar =
            GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).map_err(|e| e.to_string());
        ValidationContext {
            // The default model's embedding has a row for every token of its tokenizer.
            vocab_rows: tokenizer.vocab_size(),
            tokenizer,
            served_model_names: ServedNames::new(
                &[SERVED_MODEL.to_string()],
                SERVED_MODEL.to_string(),
            ),
            max_model_len: MAX_MODEL_LEN,
            kv_sequence_tokens: 4 * MAX_MODEL_LEN,
            limits: RequestLimits::default(),
            grammar: GrammarService::new(grammar, Default::default()),
            tool_parser: None,
            reasoning: Default::default(),
            work_slots: Default::default(),
        }
    })
}

/// A `POST /v1/chat/completions` body.
pub fn chat_request(data: &[u8]) {
    let ctx = context();
    let outcome = runtime().block_on(async {
        let body = parse_json_body(data)?;
        let request = ChatRequest::parse(&body)?;
        ValidRequest::chat(request, ctx).await
    });
    check(outcome, ctx);
}

/// A `POST /v1/completions` body.
pub fn completion_request(data: &[u8]) {
    let ctx = context();
    let outcome = runtime().block_on(async {
        let body = parse_json_body(data)?;
        let request = CompletionRequest::parse(&body)?;
        ValidRequest::completion(request, ctx).await
    });
    check(outcome, ctx);
}

/// A refusal is a client error with a message; an accepted request fits the model.
fn check(outcome: Result<ValidRequest, ServerError>, ctx: &ValidationContext) {
    match outcome {
        Err(e) => {
            let status = e.status();
            assert!(
                status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND,
                "a request body was refused with {status}: {e:?}"
            );
            let body = serde_json::to_value(e.body()).unwrap_or_default();
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(!message.is_empty(), "an error without a message: {body}");
        }
        Ok(valid) => check_valid(&valid, ctx),
    }
}

fn check_valid(valid: &ValidRequest, ctx: &ValidationContext) {
    let vocab = ctx.tokenizer.vocab_size();
    assert!(
        !valid.prompts().is_empty(),
        "a valid request without prompts"
    );
    for prompt in valid.prompts() {
        assert!(!prompt.ids.is_empty(), "an empty prompt was accepted");
        assert!(prompt.max_tokens >= 1, "max_tokens 0 was accepted");
        assert!(
            prompt.ids.len() + prompt.max_tokens <= ctx.max_model_len,
            "{} prompt tokens + max_tokens {} exceed the context of {}",
            prompt.ids.len(),
            prompt.max_tokens,
            ctx.max_model_len
        );
        assert!(
            prompt.ids.iter().all(|&id| (id as usize) < vocab),
            "a token id out of the vocabulary was accepted"
        );
    }
    let choices = valid.planned_choices();
    assert!(
        !choices.is_empty() && choices.len() <= 64,
        "{} choices",
        choices.len()
    );
    assert_eq!(valid.model(), ctx.served_model_names.primary());
}
