//! The OpenAI API as `tessera chat` uses it: the model's name from `/v1/models`, and a
//! streamed chat completion whose text deltas reach the caller as they arrive.

use anyhow::{anyhow, bail, Context, Result};
use reqwest::header::AUTHORIZATION;
use serde_json::{json, Value};

use crate::chat_cmd::sse::SseDecoder;

/// Sampling settings sent with every turn (unset: the server's defaults).
#[derive(Debug, Clone, Default)]
pub struct TurnSettings {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub seed: Option<u64>,
}

/// One piece of a streamed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Thinking, for a reasoning model (`delta.reasoning_content`).
    Reasoning(String),
    Content(String),
}

pub struct ChatClient {
    http: reqwest::Client,
    /// The server's base URL, without a trailing `/`.
    base: String,
    api_key: Option<String>,
}

impl ChatClient {
    pub fn new(base: &str, api_key: Option<String>) -> Result<Self> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("tessera-chat/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("starting the HTTP client")?;
        Ok(ChatClient {
            http,
            base: base.trim_end_matches('/').to_string(),
            api_key,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.api_key {
            Some(key) => request.header(AUTHORIZATION, format!("Bearer {key}")),
            None => request,
        }
    }

    /// The name of the server's model (the first `/v1/models` lists).
    pub async fn model(&self) -> Result<String> {
        let response = self
            .request(reqwest::Method::GET, "/v1/models")
            .send()
            .await
            .with_context(|| format!("connecting to {}", self.base))?;
        let status = response.status();
        let body: Value = serde_json::from_slice(&response.bytes().await?).unwrap_or(Value::Null);
        if status == reqwest::StatusCode::UNAUTHORIZED {
            bail!(
                "{} wants an API key: give it with --api-key KEY or TESSERA_API_KEY",
                self.base
            );
        }
        if !status.is_success() {
            bail!("{}/v1/models: {}", self.base, error_text(status, &body));
        }
        body["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("{}/v1/models lists no model", self.base))
    }

    /// Streams the answer to `messages`, giving each piece to `on_piece` as it comes;
    /// the whole answer's text at the end.
    pub async fn answer(
        &self,
        model: &str,
        messages: Vec<Value>,
        settings: &TurnSettings,
        mut on_piece: impl FnMut(Piece),
    ) -> Result<String> {
        let mut body = json!({"model": model, "messages": messages, "stream": true});
        if let Some(n) = settings.max_tokens {
            body["max_tokens"] = json!(n);
        }
        if let Some(t) = settings.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(s) = settings.seed {
            body["seed"] = json!(s);
        }
        let mut response = self
            .request(reqwest::Method::POST, "/v1/chat/completions")
            .json(&body)
            .send()
            .await
            .with_context(|| format!("connecting to {}", self.base))?;
        let status = response.status();
        if !status.is_success() {
            let body: Value =
                serde_json::from_slice(&response.bytes().await?).unwrap_or(Value::Null);
            bail!("{}", error_text(status, &body));
        }
        let mut decoder = SseDecoder::default();
        let mut text = String::new();
        while let Some(chunk) = response.chunk().await.context("reading the answer")? {
            for event in decoder.push(&chunk) {
                if event.data == "[DONE]" {
                    return Ok(text);
                }
                let value: Value = serde_json::from_str(&event.data)
                    .with_context(|| format!("a chunk that is not JSON: {}", event.data))?;
                if value.get("error").is_some() {
                    bail!("{}", error_text(status, &value));
                }
                let delta = &value["choices"][0]["delta"];
                if let Some(r) = delta["reasoning_content"]
                    .as_str()
                    .filter(|r| !r.is_empty())
                {
                    on_piece(Piece::Reasoning(r.to_string()));
                }
                if let Some(c) = delta["content"].as_str().filter(|c| !c.is_empty()) {
                    text.push_str(c);
                    on_piece(Piece::Content(c.to_string()));
                }
            }
        }
        bail!("the stream ended before its end ([DONE])")
    }
}

/// An OpenAI error envelope's message, else the status.
fn error_text(status: reqwest::StatusCode, body: &Value) -> String {
    match body["error"]["message"].as_str() {
        Some(message) => message.to_string(),
        None => format!("the server answered {status}"),
    }
}
