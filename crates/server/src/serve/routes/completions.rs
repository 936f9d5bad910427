//! `POST /v1/completions`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tessera_protocol::TokenLogprobs;
use tessera_tokenizer::Tokenizer;

use crate::api::completions::request::CompletionRequest;
use crate::api::error::ServerError;
use crate::api::response::{Completion, CompletionChoice, CompletionLogprobs, TokenLogprob, Usage};
use crate::api::valid_request::ValidRequest;
use crate::serve::generation::{
    cached_prompt_tokens, collect_all, log_end_user, log_ignored_fields, token_logprob, Submitted,
};
use crate::serve::json_body::JsonBody;
use crate::serve::state::AppState;
use crate::serve::stream::{sse_response, to_json, ChoiceEnd, ChunkFormat};

pub async fn completions(
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req = CompletionRequest::parse(&body)?;
    log_end_user(req.params.user.as_ref());
    log_ignored_fields(&req.ignored);
    let valid = ValidRequest::completion(req, &app.validation).await?;
    let Submitted {
        runs,
        prompt_tokens,
        id,
        created,
        model,
        with_logprobs,
    } = Submitted::new(&app, &valid, "cmpl")?;
    let echo_texts: Vec<String> = valid
        .prompts()
        .iter()
        .map(|p| {
            if valid.echo() {
                p.text.clone()
            } else {
                String::new()
            }
        })
        .collect();
    if valid.stream() {
        let mut format = CompletionFormat::new(id, created, model, with_logprobs, echo_texts);
        if with_logprobs && valid.echo() {
            let prompts = valid.prompts().iter().map(|p| p.ids.clone()).collect();
            format = format.scoring_echoes(prompts, app.validation.tokenizer.clone());
        }
        return Ok(sse_response(
            runs,
            format,
            prompt_tokens,
            valid.include_usage(),
            &app.limits,
        ));
    }
    let outputs = collect_all(runs).await?;
    let cached = cached_prompt_tokens(&outputs);
    let score_only = valid.score_only();
    let completion_tokens = if score_only {
        0
    } else {
        outputs.iter().map(|o| o.completion_tokens).sum()
    };
    let tokenizer = &app.validation.tokenizer;
    let choices = outputs
        .into_iter()
        .map(|o| {
            let echo = echo_texts.get(o.prompt_index).cloned().unwrap_or_default();
            let logprobs = if with_logprobs {
                let mut lp = CompletionLogprobs::default();
                if let (Some(scored), Some(prompt)) =
                    (&o.prompt_logprobs, valid.prompts().get(o.prompt_index))
                {
                    echoed_prompt_logprobs(&mut lp, tokenizer, &prompt.ids, scored)?;
                }
                if !score_only {
                    lp.extend(&o.logprobs, echo.chars().count());
                }
                Some(lp)
            } else {
                None
            };
            // The prompt alone: the token generated to get there is dropped.
            let (text, finish_reason) = if score_only {
                (echo, "length")
            } else {
                (echo + &o.text, o.finish_reason)
            };
            Ok(CompletionChoice {
                index: o.index,
                text,
                logprobs,
                finish_reason: Some(finish_reason),
            })
        })
        .collect::<Result<_, ServerError>>()?;
    Ok(Json(Completion {
        id,
        object: "text_completion",
        created,
        model,
        choices,
        usage: Some(Usage::new(prompt_tokens, completion_tokens).with_cached(cached)),
    })
    .into_response())
}

/// The echoed prompt's tokens first: the first unscored, each later one with the
/// log-probability the model gave it after the tokens before it.
fn echoed_prompt_logprobs(
    lp: &mut CompletionLogprobs,
    tokenizer: &Tokenizer,
    ids: &[u32],
    scored: &[TokenLogprobs],
) -> Result<(), ServerError> {
    let Some((&first, rest)) = ids.split_first() else {
        return Ok(());
    };
    let mut offset = lp.push_unscored(tokenizer.decode(&[first], false)?, 0);
    for (&id, s) in rest.iter().zip(scored) {
        offset = lp.extend(&[token_logprob(tokenizer, id, s)?], offset);
    }
    Ok(())
}

/// The `text_completion` chunks of a streamed completion.
pub struct CompletionFormat {
    id: String,
    created: u64,
    model: String,
    with_logprobs: bool,
    /// The prompts when echoed, by prompt index.
    echo_texts: Vec<String>,
    /// Character offset reached by each choice's text (for `text_offset`).
    offsets: HashMap<usize, usize>,
    /// When echoed prompts are sent with their log-probabilities.
    scoring: Option<EchoScoring>,
    /// Choices whose echoed prompt waits for its scores: index to prompt index.
    held_echoes: HashMap<usize, usize>,
}

/// What an echoed prompt's scores are turned into text with.
struct EchoScoring {
    /// The prompts' tokens, by prompt index.
    prompts: Vec<Vec<u32>>,
    tokenizer: Arc<Tokenizer>,
}

impl CompletionFormat {
    /// Chunks of one streamed completion; `echo_texts` are the prompts when echoed.
    pub fn new(
        id: String,
        created: u64,
        model: String,
        with_logprobs: bool,
        echo_texts: Vec<String>,
    ) -> Self {
        CompletionFormat {
            id,
            created,
            model,
            with_logprobs,
            echo_texts,
            offsets: HashMap::new(),
            scoring: None,
            held_echoes: HashMap::new(),
        }
    }

    /// Sends each echoed prompt with its log-probabilities (`prompts`: the prompts'
    /// tokens by prompt index), once they come with the choice's first token.
    pub fn scoring_echoes(mut self, prompts: Vec<Vec<u32>>, tokenizer: Arc<Tokenizer>) -> Self {
        self.scoring = Some(EchoScoring { prompts, tokenizer });
        self
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> String {
        to_json(&Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    fn echo_chunk(
        &self,
        index: usize,
        text: String,
        logprobs: Option<CompletionLogprobs>,
    ) -> String {
        self.chunk(
            vec![CompletionChoice {
                index,
                text,
                logprobs,
                finish_reason: None,
            }],
            None,
        )
    }

    /// The echoed prompt of choice `index` with the scores it has: all of them once
    /// they came, none if the choice produced text without them.
    fn release_echo(
        &mut self,
        index: usize,
        scored: &[TokenLogprobs],
    ) -> Result<Vec<String>, ServerError> {
        let Some(prompt_index) = self.held_echoes.remove(&index) else {
            return Ok(Vec::new());
        };
        let text = self
            .echo_texts
            .get(prompt_index)
            .cloned()
            .unwrap_or_default();
        let mut lp = CompletionLogprobs::default();
        if let Some(s) = &self.scoring {
            let ids = s.prompts.get(prompt_index).map_or(&[][..], Vec::as_slice);
            echoed_prompt_logprobs(&mut lp, &s.tokenizer, ids, scored)?;
        }
        Ok(vec![self.echo_chunk(index, text, Some(lp))])
    }
}

impl ChunkFormat for CompletionFormat {
    fn opening(&mut self, choices: &[(usize, usize)]) -> Vec<String> {
        let mut out = Vec::new();
        for &(index, prompt_index) in choices {
            let echo = self
                .echo_texts
                .get(prompt_index)
                .cloned()
                .unwrap_or_default();
            self.offsets.insert(index, echo.chars().count());
            if self.scoring.is_some() {
                // Sent with its log-probabilities, which come with the first token.
                self.held_echoes.insert(index, prompt_index);
            } else if !echo.is_empty() {
                out.push(self.echo_chunk(index, echo, None));
            }
        }
        out
    }

    fn prompt_scored(
        &mut self,
        index: usize,
        logprobs: &[TokenLogprobs],
    ) -> Result<Vec<String>, ServerError> {
        self.release_echo(index, logprobs)
    }

    fn delta(&mut self, index: usize, text: String, logprobs: &[TokenLogprob]) -> Vec<String> {
        // The engine scores an echoed prompt before its first token; should the scores
        // ever be missing, the prompt still comes first.
        let mut out = self.release_echo(index, &[]).unwrap_or_default();
        let lp = self.with_logprobs.then(|| {
            let mut lp = CompletionLogprobs::default();
            let offset = self.offsets.get(&index).copied().unwrap_or(0);
            self.offsets.insert(index, lp.extend(logprobs, offset));
            lp
        });
        out.push(self.chunk(
            vec![CompletionChoice {
                index,
                text,
                logprobs: lp,
                finish_reason: None,
            }],
            None,
        ));
        out
    }

    fn finish(&mut self, index: usize, end: &ChoiceEnd) -> Vec<String> {
        let reason = end.reason;
        let mut out = self.release_echo(index, &[]).unwrap_or_default();
        out.push(self.chunk(
            vec![CompletionChoice {
                index,
                text: String::new(),
                logprobs: None,
                finish_reason: Some(reason),
            }],
            None,
        ));
        out
    }

    fn usage(&mut self, usage: Usage) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
