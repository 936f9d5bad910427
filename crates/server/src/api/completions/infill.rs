//! `suffix` on `/v1/completions`: the model writes what goes between the prompt and the
//! suffix, through its vocabulary's fill-in-the-middle tokens
//! ([`tessera_tokenizer::FimTokens`]).

use tessera_tokenizer::{Tokenizer, TokenizerError};

use crate::api::completions::request::{CompletionRequest, PromptField};
use crate::api::error::ServerError;
use crate::api::params::spec::GenerationSpec;

/// The request's suffix when it asks for one (an empty suffix asks for nothing, as the
/// field's default), after checking that it can be honoured: the model has the tokens,
/// the prompts are text, and nothing else rewrites the prompt around it.
pub fn requested_suffix(
    req: &CompletionRequest,
    spec: &GenerationSpec,
    tokenizer: &Tokenizer,
) -> Result<Option<String>, ServerError> {
    let Some(suffix) = req.completion.suffix.clone().filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    if tokenizer.fim_tokens().is_none() {
        return Err(ServerError::invalid(
            "suffix",
            format!(
                "`suffix` cannot be honoured: {}",
                TokenizerError::NoFimTokens
            ),
        ));
    }
    if matches!(
        req.completion.prompt,
        PromptField::Ids(_) | PromptField::IdLists(_)
    ) {
        return Err(ServerError::invalid(
            "suffix",
            "`suffix` needs a text `prompt`: token ids cannot be placed around the \
             fill-in-the-middle tokens",
        ));
    }
    if req.completion.echo == Some(true) {
        return Err(ServerError::invalid(
            "echo",
            "`echo` cannot be combined with `suffix`",
        ));
    }
    if spec.truncate_prompt_tokens.is_some() {
        return Err(ServerError::invalid(
            "truncate_prompt_tokens",
            "`truncate_prompt_tokens` cannot be combined with `suffix`: cutting the \
             prompt's start would cut the fill-in-the-middle tokens",
        ));
    }
    Ok(Some(suffix))
}
