//! `POST /v1/completions` request body, as sent.

use serde::Deserialize;
use serde_json::Value;

use crate::api::error::ServerError;
use crate::api::params::fields::{
    as_object, parse_noting_ignored, refuse_unsupported, GenerationParams, IgnoredFields, Route,
};

/// `prompt`: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

/// One prompt before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// Completion-only fields; the shared ones are in [`GenerationParams`].
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionFields {
    pub prompt: PromptField,
    pub echo: Option<bool>,
    /// Number of alternatives to return per token (0 returns only the chosen one).
    pub logprobs: Option<u64>,
    /// Text that follows the completion: the model fills in what goes between the prompt
    /// and it ([`crate::api::completions::infill`]).
    pub suffix: Option<String>,
}

#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub params: GenerationParams,
    pub completion: CompletionFields,
    /// Paths of the body's fields that nothing reads (unknown to this server).
    pub ignored: Vec<String>,
}

impl CompletionRequest {
    pub fn parse(body: &Value) -> Result<Self, ServerError> {
        let object = as_object(body)?;
        let checked = refuse_unsupported(object, Route::Completion)?;
        let mut ignored = IgnoredFields::default();
        Ok(CompletionRequest {
            params: parse_noting_ignored(body, &mut ignored)?,
            completion: parse_noting_ignored(body, &mut ignored)?,
            ignored: ignored.paths(&checked),
        })
    }

    /// The prompts, one choice group each.
    pub fn prompts(&self) -> Result<Vec<PromptInput>, ServerError> {
        let prompts = match &self.completion.prompt {
            PromptField::Text(t) => vec![PromptInput::Text(t.clone())],
            PromptField::Texts(ts) => ts.iter().cloned().map(PromptInput::Text).collect(),
            PromptField::Ids(ids) => vec![PromptInput::Ids(ids.clone())],
            PromptField::IdLists(lists) => lists.iter().cloned().map(PromptInput::Ids).collect(),
        };
        if prompts.is_empty() {
            return Err(ServerError::invalid("prompt", "`prompt` must not be empty"));
        }
        Ok(prompts)
    }
}
