//! How a chat's messages become its prompt, beyond the messages themselves (vLLM's
//! fields): `add_generation_prompt`, `continue_final_message` (the prompt ends inside the
//! final message, so the model continues it) and `chat_template_kwargs` (variables for
//! the template, such as Qwen3's `enable_thinking`).

use serde::Deserialize;
use serde_json::{Map, Value};
use tessera_tokenizer::{ChatMessage, ChatRenderRequest, TokenizerError};

use crate::api::chat_request::ChatMessageIn;
use crate::api::error::ServerError;

/// Variables the server gives the template itself; a request sets them by their own
/// fields, not through `chat_template_kwargs`.
const RESERVED: [&str; 5] = [
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "continue_final_message",
];

/// The rendering fields as sent.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RenderFields {
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Default true (false with `continue_final_message`).
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
}

/// The rendering fields, checked against the messages.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    add_generation_prompt: bool,
    kwargs: Map<String, Value>,
    /// With `continue_final_message`: the final message's text, where the prompt ends.
    continue_from: Option<String>,
}

impl RenderFields {
    pub fn check(&self, messages: &[ChatMessageIn]) -> Result<RenderOptions, ServerError> {
        let kwargs = self.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(key) = RESERVED.iter().find(|k| kwargs.contains_key(**k)) {
            return Err(ServerError::invalid(
                "chat_template_kwargs",
                format!("`chat_template_kwargs` cannot set `{key}`: use the request's own field"),
            ));
        }
        let continue_final = self.continue_final_message.unwrap_or(false);
        let add_generation_prompt =
            match (self.add_generation_prompt, continue_final) {
                (Some(true), true) => return Err(ServerError::invalid(
                    "continue_final_message",
                    "`continue_final_message` cannot be combined with `add_generation_prompt`: \
                     true",
                )),
                (Some(add), _) => add,
                (None, continue_final) => !continue_final,
            };
        let continue_from = if continue_final {
            let text = messages
                .last()
                .and_then(|m| m.content.as_ref())
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty());
            match text {
                Some(text) => Some(text.to_string()),
                None => {
                    return Err(ServerError::invalid(
                        "continue_final_message",
                        "`continue_final_message` needs a final message whose `content` is a \
                         non-empty string",
                    ))
                }
            }
        } else {
            None
        };
        Ok(RenderOptions {
            add_generation_prompt,
            kwargs,
            continue_from,
        })
    }
}

impl RenderOptions {
    /// What the template renders for `messages` and `tools`.
    pub fn request(
        &self,
        messages: Vec<ChatMessage>,
        tools: Option<Vec<Value>>,
    ) -> ChatRenderRequest {
        ChatRenderRequest {
            messages,
            add_generation_prompt: self.add_generation_prompt,
            tools,
            kwargs: self.kwargs.clone(),
        }
    }

    /// The prompt from the template's text: with `continue_final_message`, cut right
    /// after the final message's text, so whatever the template closes a message with
    /// (an end-of-turn token) is not in it.
    pub fn prompt(&self, rendered: String) -> Result<String, ServerError> {
        let Some(text) = &self.continue_from else {
            return Ok(rendered);
        };
        match rendered.rfind(text.as_str()) {
            Some(at) => {
                let mut prompt = rendered;
                prompt.truncate(at + text.len());
                Ok(prompt)
            }
            None => Err(ServerError::invalid(
                "continue_final_message",
                "the chat template does not write the final message as sent, so it cannot be \
                 continued",
            )),
        }
    }
}

/// A chat template that is missing or failed, as the request's fault.
pub fn template_error(e: TokenizerError) -> ServerError {
    match e {
        TokenizerError::NoChatTemplate => ServerError::invalid(
            "messages",
            "the model has no chat template; use /v1/completions",
        ),
        TokenizerError::Template(m) | TokenizerError::TemplateInput(m) => {
            ServerError::invalid("messages", format!("the chat template failed: {m}"))
        }
        other => ServerError::from(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(v: Value) -> Vec<ChatMessageIn> {
        serde_json::from_value(v).unwrap_or_default()
    }

    fn fields(v: Value) -> RenderFields {
        serde_json::from_value(v).unwrap_or_default()
    }

    #[test]
    fn defaults_continuation_and_kwargs() {
        let chat = messages(json!([
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "It is"}
        ]));
        let plain = fields(json!({})).check(&chat).ok();
        assert_eq!(
            plain
                .as_ref()
                .map(|o| (o.add_generation_prompt, o.kwargs.len())),
            Some((true, 0))
        );
        let rendered = "<u>Capital of France?</u><a>It is</a>\n".to_string();
        let opts = fields(json!({"continue_final_message": true,
                                 "chat_template_kwargs": {"enable_thinking": false}}))
        .check(&chat)
        .ok();
        let opts = opts.as_ref();
        assert_eq!(opts.map(|o| o.add_generation_prompt), Some(false));
        assert_eq!(
            opts.map(|o| o.kwargs.get("enable_thinking").cloned()),
            Some(Some(json!(false)))
        );
        assert_eq!(
            opts.and_then(|o| o.prompt(rendered.clone()).ok())
                .as_deref(),
            Some("<u>Capital of France?</u><a>It is")
        );
        // The text is not there as sent: refused rather than continued elsewhere.
        assert!(opts.is_some_and(|o| o.prompt("<a>It was</a>".into()).is_err()));
        let keep = fields(json!({})).check(&chat).ok();
        assert_eq!(
            keep.and_then(|o| o.prompt(rendered.clone()).ok()),
            Some(rendered)
        );
    }

    #[test]
    fn conflicts_are_refused_by_name() {
        let chat = messages(json!([{"role": "user", "content": "Hi"}]));
        let empty = messages(json!([{"role": "assistant", "content": ""}]));
        let cases = [
            (
                json!({"chat_template_kwargs": {"messages": []}}),
                &chat,
                "chat_template_kwargs",
            ),
            (
                json!({"chat_template_kwargs": {"tools": []}}),
                &chat,
                "chat_template_kwargs",
            ),
            (
                json!({"continue_final_message": true, "add_generation_prompt": true}),
                &chat,
                "continue_final_message",
            ),
            (
                json!({"continue_final_message": true}),
                &empty,
                "continue_final_message",
            ),
        ];
        for (body, msgs, param) in cases {
            match fields(body.clone()).check(msgs) {
                Err(e) => assert_eq!(e.param(), Some(param), "{body}"),
                Ok(o) => panic!("{body} accepted: {o:?}"),
            }
        }
    }
}
