//! `ChatTemplate`: a model's Jinja chat template, compiled once and rendered per request
//! the way Hugging Face's `apply_chat_template` renders it.
//!
//! Environment (matching transformers): `trim_blocks` and `lstrip_blocks` on, one trailing
//! newline of the source dropped, loop controls, Python string/dict methods (`.strip()`,
//! `.items()`, ...), the globals `raise_exception(msg)` and `strftime_now(fmt)`, and a
//! `tojson` that writes what Python's `json.dumps` writes. `{{ value }}` prints booleans
//! and none as Python does (`True`, `False`, `None`); other Python `str()` spellings
//! (lists, `| string`) keep minijinja's form.
//!
//! Inputs: `messages`, `add_generation_prompt`, `tools` when given, the special tokens
//! (`bos_token`, `eos_token`, ...) and any extra keyword arguments; extra arguments win
//! over special tokens of the same name, as in transformers.
//!
//! Bounds: templates come with model files and are not trusted. Rendering runs with a
//! fuel budget (minijinja instructions), a recursion limit and a cap on the output size,
//! so a template that loops for ever, recurses without end or writes without end fails
//! with an error instead of holding a thread. minijinja has no memory accounting, so a
//! template that doubles a string in a loop is bounded only by isolation: after
//! [`ChatTemplate::isolate`], renders run in sandbox processes with a memory limit
//! (`crate::sandbox`), and such a template fails its request instead of the server.

use std::sync::Arc;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value, ValueKind};
use minijinja::{escape_formatter, Environment, Error, ErrorKind, Output, State};
use serde_json::Map;

use crate::chat_message::{ChatMessage, ContentFormat};
use crate::error::{Result, TokenizerError};
use crate::py_json;
use crate::sandbox::{SandboxInit, SandboxLauncher, TemplateSandbox};
use crate::strftime;
pub use crate::template_settings::{ChatTemplateConfig, SpecialTokenStrings};

const TEMPLATE_NAME: &str = "chat_template";

/// One render: the conversation and the switches a chat request sets.
#[derive(Debug, Clone, Default)]
pub struct ChatRenderRequest {
    pub messages: Vec<ChatMessage>,
    /// Append the opening of an assistant turn (`<|im_start|>assistant\n` for ChatML).
    pub add_generation_prompt: bool,
    /// Tool (function) definitions, passed to the template as `tools`.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub kwargs: Map<String, serde_json::Value>,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    special_tokens: SpecialTokenStrings,
    content_format: ContentFormat,
    config: ChatTemplateConfig,
    /// Where renders run once [`ChatTemplate::isolate`] was called; in this process before.
    sandbox: Option<Arc<TemplateSandbox>>,
}

impl ChatTemplate {
    /// Compiles `source`. Syntax errors are reported here, with the line.
    pub fn new(
        source: &str,
        special_tokens: SpecialTokenStrings,
        config: &ChatTemplateConfig,
    ) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?;
        env.set_syntax(syntax);
        env.set_fuel(Some(config.fuel));
        env.set_recursion_limit(config.recursion_limit);
        env.set_formatter(python_formatter);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", py_json::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME.to_string(), source.to_string())?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            special_tokens,
            content_format: ContentFormat::detect(source),
            config: config.clone(),
            sandbox: None,
        })
    }

    /// From now on renders run in sandbox processes that `launcher` starts, each with a
    /// memory limit and a deadline. Starts one at once, so that a launcher that cannot work
    /// fails here, at start-up, and not on the first request.
    pub fn isolate(&mut self, launcher: SandboxLauncher) -> Result<()> {
        let init = SandboxInit {
            source: self.source.clone(),
            special_tokens: self.special_tokens.clone(),
            config: self.config.clone(),
            memory_limit_bytes: launcher.memory_limit_bytes,
        };
        self.sandbox = Some(Arc::new(TemplateSandbox::start(launcher, init)?));
        Ok(())
    }

    /// Whether renders run in sandbox processes.
    pub fn is_isolated(&self) -> bool {
        self.sandbox.is_some()
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// How message content is handed to this template (detected from its source).
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// Overrides the detected content format.
    pub fn with_content_format(mut self, format: ContentFormat) -> Self {
        self.content_format = format;
        self
    }

    /// Renders the prompt text. Encode it with `add_special_tokens = false`: the template
    /// already wrote any BOS it wants.
    pub fn render(&self, request: &ChatRenderRequest) -> Result<String> {
        let ctx = self.context(request)?;
        match &self.sandbox {
            Some(sandbox) => sandbox.render(&ctx),
            None => self.render_context(&ctx),
        }
    }

    /// The variables the template sees for `request`.
    fn context(&self, request: &ChatRenderRequest) -> Result<Map<String, serde_json::Value>> {
        let mut messages = Vec::with_capacity(request.messages.len());
        for message in &request.messages {
            messages.push(message.to_template_value(self.content_format)?);
        }
        let mut ctx = Map::new();
        let specials = [
            ("bos_token", &self.special_tokens.bos_token),
            ("eos_token", &self.special_tokens.eos_token),
            ("unk_token", &self.special_tokens.unk_token),
            ("pad_token", &self.special_tokens.pad_token),
        ];
        for (name, value) in specials {
            if let Some(value) = value {
                ctx.insert(name.to_string(), serde_json::Value::String(value.clone()));
            }
        }
        ctx.insert("messages".to_string(), serde_json::Value::Array(messages));
        ctx.insert(
            "add_generation_prompt".to_string(),
            serde_json::Value::Bool(request.add_generation_prompt),
        );
        // transformers always passes `tools` and `documents`, as None when absent; templates
        // test `tools is not none`, which an undefined variable would pass.
        let tools = match &request.tools {
            Some(tools) => serde_json::Value::Array(tools.clone()),
            None => serde_json::Value::Null,
        };
        ctx.insert("tools".to_string(), tools);
        ctx.insert("documents".to_string(), serde_json::Value::Null);
        for (key, value) in &request.kwargs {
            ctx.insert(key.clone(), value.clone());
        }
        Ok(ctx)
    }

    /// Renders `ctx` in this process.
    pub(crate) fn render_context(&self, ctx: &Map<String, serde_json::Value>) -> Result<String> {
        let template = self.env.get_template(TEMPLATE_NAME)?;
        let mut out = CappedWriter {
            buf: Vec::new(),
            max_bytes: self.config.max_output_bytes,
            overflowed: false,
        };
        let rendered = template.render_captured_to(Value::from(Serde(ctx)), &mut out);
        if let Err(err) = rendered {
            let overflowed = out.overflowed;
            return Err(match err.kind() {
                ErrorKind::OutOfFuel => TokenizerError::Template(format!(
                    "rendering exceeded its budget of {} instructions (a runaway loop?): {err}",
                    self.env.fuel().unwrap_or_default()
                )),
                _ if overflowed => TokenizerError::Template(format!(
                    "rendered prompt exceeds {} bytes: {err}",
                    self.config.max_output_bytes
                )),
                _ => TokenizerError::from(err),
            });
        }
        // The writer only ever receives `str` data from minijinja.
        String::from_utf8(out.buf)
            .map_err(|e| TokenizerError::Template(format!("rendered text is not UTF-8: {e}")))
    }
}

/// Collects the rendered text and fails the render once it would pass `max_bytes`.
struct CappedWriter {
    buf: Vec<u8>,
    max_bytes: usize,
    overflowed: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.max_bytes {
            self.overflowed = true;
            return Err(std::io::Error::other("output size limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `raise_exception(message)`: templates call it to reject a conversation (e.g. roles out
/// of order). The message reaches the client.
fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised: {message}"),
    ))
}

/// Prints `True`/`False`/`None` as Jinja2 under Python does.
fn python_formatter(
    out: &mut Output,
    state: &mut State,
    value: &Value,
) -> std::result::Result<(), Error> {
    let python = match value.kind() {
        ValueKind::Bool if value.is_true() => "True",
        ValueKind::Bool => "False",
        ValueKind::None => "None",
        _ => return escape_formatter(out, state, value),
    };
    escape_formatter(out, state, &Value::from(python))
}

fn strftime_now(format: String) -> String {
    strftime::strftime_now(&format)
}
