//! `POST /tokenize` and `POST /detokenize`.

use std::sync::Arc;

use crate::api::chat::render::{template_error, RenderOptions};
use crate::api::chat::request::template_messages;
use crate::api::error::ServerError;
use crate::api::params::fields::parse_fields;
use crate::api::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
};
use crate::api::tools::prompt::adapt_to_template;
use crate::api::tools::request::ToolRequest;
use crate::api::valid_request::{blocking, too_long};
use crate::serve::json_body::JsonBody;
use crate::serve::state::AppState;
use axum::extract::State;
use axum::Json;

fn check_model(app: &AppState, model: &Option<String>) -> Result<(), ServerError> {
    match model {
        Some(m) => app.validation.served_model_names.check(m),
        None => Ok(()),
    }
}

pub async fn tokenize(
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<TokenizeResponse>, ServerError> {
    let req: TokenizeRequest = parse_fields(&body)?;
    check_model(&app, &req.model)?;
    let tokenizer = Arc::clone(&app.validation.tokenizer);
    let return_strs = req.return_token_strs.unwrap_or(false);
    let render = req.render_fields();
    let job = match (req.prompt, req.messages) {
        (Some(prompt), None) => {
            let special = req.add_special_tokens.unwrap_or(true);
            Job::Prompt(prompt, special)
        }
        (None, Some(messages)) => Job::Chat(
            template_messages(&messages)?,
            ToolRequest::parse(req.tools.as_ref(), None, None)?,
            render.check(&messages)?,
            req.add_special_tokens.unwrap_or(false),
        ),
        _ => {
            return Err(ServerError::invalid(
                "prompt",
                "give exactly one of `prompt` or `messages`",
            ))
        }
    };
    // A text longer than the model's context is refused, not tokenized whole: it could
    // never be a prompt, and tokenizing megabytes costs hundreds of megabytes.
    let max_model_len = app.validation.max_model_len;
    let parser_flag = app.validation.tool_parser;
    let tokens = blocking(
        &app.validation.work_slots,
        move || -> Result<(Vec<u32>, Vec<String>), ServerError> {
            let (text, special, param) = match job {
                Job::Prompt(text, special) => (text, special, "prompt"),
                Job::Chat(messages, tools, render, special) => {
                    let template = tokenizer.chat_template().map_err(template_error)?;
                    render.check_template(template.source())?;
                    // Tool calls, results and tools as a chat completion writes them.
                    let (messages, template_tools, _) =
                        adapt_to_template(messages, tools.as_ref(), template.source(), parser_flag);
                    let text = template
                        .render(&render.request(messages, template_tools))
                        .map_err(template_error)?;
                    (render.prompt(text)?, special, "messages")
                }
            };
            let ids = tokenizer
                .encode_within(&text, special, max_model_len)
                .map_err(|e| too_long(e, param, max_model_len))?;
            let strs = if return_strs {
                ids.iter()
                    .map(|&id| tokenizer.id_to_token(id).unwrap_or_default())
                    .collect()
            } else {
                Vec::new()
            };
            Ok((ids, strs))
        },
    )
    .await??;
    let (tokens, strs) = tokens;
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: app.validation.max_model_len,
        tokens,
        token_strs: return_strs.then_some(strs),
    }))
}

enum Job {
    Prompt(String, bool),
    Chat(
        Vec<tessera_tokenizer::ChatMessage>,
        Option<ToolRequest>,
        RenderOptions,
        bool,
    ),
}

pub async fn detokenize(
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<DetokenizeResponse>, ServerError> {
    let req: DetokenizeRequest = parse_fields(&body)?;
    check_model(&app, &req.model)?;
    let vocab = app.validation.tokenizer.vocab_size();
    if let Some(bad) = req.tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ServerError::invalid(
            "tokens",
            format!("token id {bad} is out of range (vocabulary size {vocab})"),
        ));
    }
    let tokenizer = Arc::clone(&app.validation.tokenizer);
    let prompt = blocking(&app.validation.work_slots, move || {
        tokenizer.decode(&req.tokens, false)
    })
    .await??;
    Ok(Json(DetokenizeResponse { prompt }))
}
