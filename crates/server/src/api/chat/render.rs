//! How a chat's messages become its prompt, beyond the messages themselves (vLLM's
//! fields): `add_generation_prompt`, `continue_final_message` (the prompt ends inside the
//! final message, so the model continues it), `chat_template_kwargs` (variables for the
//! template, such as Qwen3's `enable_thinking`) and OpenAI's `reasoning_effort` (for a
//! template that reads it, as gpt-oss's does).

use serde::Deserialize;
use serde_json::{Map, Value};
use tessera_tokenizer::{ChatMessage, ChatRenderRequest, TokenizerError};

use crate::api::chat::message::ChatMessageIn;
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
    /// OpenAI's `low`, `medium` or `high`, given to the template as `reasoning_effort`.
    pub reasoning_effort: Option<Value>,
}

/// The efforts a template is given (gpt-oss knows these three).
const EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// The rendering fields, checked against the messages.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    add_generation_prompt: bool,
    kwargs: Map<String, Value>,
    /// With `continue_final_message`: the final message's text, where the prompt ends.
    continue_from: Option<String>,
    /// Whether `reasoning_effort` was set, so the template must read it.
    effort_set: bool,
}

impl RenderFields {
    pub fn check(&self, messages: &[ChatMessageIn]) -> Result<RenderOptions, ServerError> {
        let mut kwargs = self.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(key) = RESERVED.iter().find(|k| kwargs.contains_key(**k)) {
            return Err(ServerError::invalid(
                "chat_template_kwargs",
                format!("`chat_template_kwargs` cannot set `{key}`: use the request's own field"),
            ));
        }
        let effort_set = match &self.reasoning_effort {
            None | Some(Value::Null) => false,
            Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => {
                if kwargs
                    .get("reasoning_effort")
                    .is_some_and(|v| v != e.as_str())
                {
                    return Err(ServerError::invalid(
                        "chat_template_kwargs",
                        "`chat_template_kwargs.reasoning_effort` differs from \
                         `reasoning_effort`: set one",
                    ));
                }
                kwargs.insert("reasoning_effort".into(), Value::String(e.clone()));
                true
            }
            Some(other) => {
                return Err(ServerError::invalid(
                    "reasoning_effort",
                    format!(
                        "`reasoning_effort` must be \"low\", \"medium\" or \"high\", not {other}"
                    ),
                ))
            }
        };
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
            effort_set,
        })
    }
}

impl RenderOptions {
    /// A `reasoning_effort` the template (`source`) never reads would be ignored: refused.
    pub fn check_template(&self, source: &str) -> Result<(), ServerError> {
        if self.effort_set && !source.contains("reasoning_effort") {
            return Err(ServerError::invalid(
                "reasoning_effort",
                "`reasoning_effort` is not supported: the model's chat template has no \
                 reasoning effort setting",
            ));
        }
        Ok(())
    }

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
            "the model has no chat template: start the server with --chat-template FILE (a \
             Jinja template), or send a prompt to /v1/completions",
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

    #[test]
    fn a_model_without_a_chat_template_is_told_which_flag_gives_one() {
        let e = template_error(TokenizerError::NoChatTemplate);
        assert_eq!(e.param(), Some("messages"));
        assert!(e.to_string().contains("--chat-template FILE"), "{e}");
    }

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

    /// gpt-oss's template reads `reasoning_effort`; one that does not refuses it.
    #[test]
    fn reasoning_effort_reaches_a_template_that_reads_it() {
        let chat = messages(json!([{"role": "user", "content": "Hi"}]));
        let opts = fields(json!({"reasoning_effort": "high"})).check(&chat);
        let opts = opts.as_ref().ok();
        assert_eq!(
            opts.and_then(|o| o.kwargs.get("reasoning_effort")),
            Some(&json!("high"))
        );
        let gpt_oss = "{{- \"Reasoning: \" + reasoning_effort + \"\\n\\n\" }}";
        assert!(opts.is_some_and(|o| o.check_template(gpt_oss).is_ok()));
        let other = opts.and_then(|o| o.check_template("{{ messages }}").err());
        assert_eq!(
            other.as_ref().and_then(|e| e.param()),
            Some("reasoning_effort")
        );
        // Unset (or null): nothing to read.
        let unset = fields(json!({"reasoning_effort": null})).check(&chat);
        assert!(unset.is_ok_and(|o| o.check_template("{{ messages }}").is_ok()));
        for (body, param) in [
            (json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
            (json!({"reasoning_effort": 3}), "reasoning_effort"),
            (
                json!({"reasoning_effort": "low",
                       "chat_template_kwargs": {"reasoning_effort": "high"}}),
                "chat_template_kwargs",
            ),
        ] {
            let e = fields(body.clone()).check(&chat).err();
            assert_eq!(e.as_ref().and_then(|e| e.param()), Some(param), "{body}");
        }
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
