//! The crate's one error type.
//!
//! Every fallible function in `tessera-tokenizer` returns [`TokenizerError`]. Messages name
//! the file, metadata key or template problem so that a caller can show them as they are.

use std::path::PathBuf;

/// Everything that can go wrong while loading a tokenizer, encoding, decoding or rendering
/// a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file (tokenizer_config.json, generation_config.json) is malformed.
    #[error("cannot parse {path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// The text holds a byte the model's byte-level vocabulary has no token for; encoding
    /// it would silently drop that byte.
    #[error("the text contains byte 0x{byte:02X}, which the model's vocabulary cannot represent")]
    Unrepresentable { byte: u8 },

    /// The text has more tokens than it may (see `Tokenizer::encode_within`).
    #[error("the text has more than {max_tokens} tokens")]
    TooLong { max_tokens: usize },

    /// A GGUF metadata key that the tokenizer needs is absent.
    #[error("GGUF metadata key `{key}` is missing")]
    MissingMetadata { key: String },

    /// A GGUF metadata key holds a value of the wrong type or an invalid value.
    #[error("GGUF metadata key `{key}` is invalid: {reason}")]
    InvalidMetadata { key: String, reason: String },

    /// The GGUF `tokenizer.ggml.model` is not one this crate can build.
    #[error(
        "the GGUF file's tokenizer model `{0}` is not supported (supported: gpt2 byte-level \
         BPE, llama SentencePiece); pass the model's tokenizer.json folder with --tokenizer DIR"
    )]
    UnsupportedModel(String),

    /// The GGUF `tokenizer.ggml.pre` names a pre-tokenizer whose split rules are unknown.
    #[error(
        "unsupported pre-tokenizer `{0}`: its split regex is not known; \
         load the model's tokenizer.json instead"
    )]
    UnsupportedPreTokenizer(String),

    /// The Hugging Face `tokenizers` library failed (bad tokenizer.json, encode or decode error).
    #[error("tokenizer: {0}")]
    Backend(String),

    /// Fill-in-the-middle was asked of a vocabulary without its sentinel tokens.
    #[error(
        "the model's vocabulary has no fill-in-the-middle tokens (such as <|fim_prefix|>, \
         <fim_prefix> or <PRE>): it was not trained to fill in text before a suffix"
    )]
    NoFimTokens,

    /// The tokenizer has no chat template (neither in GGUF metadata nor in tokenizer_config.json).
    #[error("the model has no chat template")]
    NoChatTemplate,

    /// The chat template failed to compile or to render.
    #[error("chat template: {0}")]
    Template(String),

    /// A chat template sandbox process could not be started or spoke out of turn.
    #[error("chat template sandbox: {0}")]
    Sandbox(String),

    /// The chat request could not be turned into template inputs.
    #[error("chat template input: {0}")]
    TemplateInput(String),
}

impl From<tokenizers::Error> for TokenizerError {
    fn from(err: tokenizers::Error) -> Self {
        TokenizerError::Backend(err.to_string())
    }
}

impl From<minijinja::Error> for TokenizerError {
    fn from(err: minijinja::Error) -> Self {
        // `Display` carries the kind, the detail and, when known, the template name and
        // line; the source chain (e.g. an error raised by a filter) is appended.
        let mut message = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        TokenizerError::Template(message)
    }
}

/// Result alias for this crate.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
