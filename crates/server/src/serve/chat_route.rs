//! `POST /v1/chat/completions`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::chat_request::ChatRequest;
use crate::api::error::ServerError;
use crate::api::response::{
    AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatDelta,
    ChatLogprobs, TokenLogprob, Usage,
};
use crate::api::valid_request::ValidRequest;
use crate::serve::generation::{collect_all, log_end_user, Submitted};
use crate::serve::json_body::JsonBody;
use crate::serve::state::AppState;
use crate::serve::stream::{sse_response, to_json, ChunkFormat};

pub async fn chat_completions(
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req = ChatRequest::parse(&body)?;
    log_end_user(req.params.user.as_ref());
    let valid = ValidRequest::chat(req, &app.validation).await?;
    let Submitted {
        runs,
        prompt_tokens,
        id,
        created,
        model,
        with_logprobs,
    } = Submitted::new(&app, &valid, "chatcmpl")?;
    if valid.stream() {
        let format = ChatFormat::new(id, created, model, with_logprobs);
        return Ok(sse_response(
            runs,
            format,
            prompt_tokens,
            valid.include_usage(),
            &app.limits,
        ));
    }
    let outputs = collect_all(runs).await?;
    let completion_tokens = outputs.iter().map(|o| o.completion_tokens).sum();
    let choices = outputs
        .into_iter()
        .map(|o| ChatChoice {
            index: o.index,
            message: AssistantMessage {
                role: "assistant",
                content: o.text,
            },
            logprobs: with_logprobs.then(|| ChatLogprobs::from_tokens(&o.logprobs)),
            finish_reason: o.finish_reason,
        })
        .collect();
    Ok(Json(ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model,
        choices,
        usage: Usage::new(prompt_tokens, completion_tokens),
    })
    .into_response())
}

/// The `chat.completion.chunk` chunks of a streamed chat completion.
pub struct ChatFormat {
    id: String,
    created: u64,
    model: String,
    with_logprobs: bool,
}

impl ChatFormat {
    /// Chunks of one streamed chat completion.
    pub fn new(id: String, created: u64, model: String, with_logprobs: bool) -> Self {
        ChatFormat {
            id,
            created,
            model,
            with_logprobs,
        }
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        to_json(&ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }
}

impl ChunkFormat for ChatFormat {
    fn opening(&mut self, choices: &[(usize, usize)]) -> Vec<String> {
        choices
            .iter()
            .map(|&(index, _)| {
                self.chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta: ChatDelta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                        },
                        logprobs: None,
                        finish_reason: None,
                    }],
                    None,
                )
            })
            .collect()
    }

    fn delta(&mut self, index: usize, text: String, logprobs: &[TokenLogprob]) -> String {
        self.chunk(
            vec![ChatChunkChoice {
                index,
                delta: ChatDelta {
                    role: None,
                    content: Some(text),
                },
                logprobs: self
                    .with_logprobs
                    .then(|| ChatLogprobs::from_tokens(logprobs)),
                finish_reason: None,
            }],
            None,
        )
    }

    fn finish(&mut self, index: usize, reason: &'static str) -> String {
        self.chunk(
            vec![ChatChunkChoice {
                index,
                delta: ChatDelta::default(),
                logprobs: None,
                finish_reason: Some(reason),
            }],
            None,
        )
    }

    fn usage(&mut self, usage: Usage) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
