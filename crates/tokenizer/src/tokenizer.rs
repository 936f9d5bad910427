//! `Tokenizer`: text to ids and back, for one model, built from a Hugging Face
//! `tokenizer.json` (+ `tokenizer_config.json`) or from a GGUF vocabulary.
//!
//! Special tokens written in the input text (`<|im_start|>`) are always recognised and
//! map to their ids: a rendered chat prompt is encoded as text.
//!
//! End-of-generation ids ([`Tokenizer::eos_token_ids`]) are the union of
//! 1. the declared EOS (`tokenizer.ggml.eos_token_id`, or `eos_token` of
//!    tokenizer_config.json),
//! 2. GGUF `tokenizer.ggml.eot_token_id` / `eom_token_id` when present,
//! 3. `eos_token_id` of generation_config.json when the HF folder has one,
//! 4. every *special* token whose text is a known end-of-turn marker
//!    ([`END_OF_TURN_MARKERS`]: `<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...), as
//!    llama.cpp does: a chat model that emits its turn terminator has finished, even when
//!    the file names a different EOS.
//!
//! The type is `Send + Sync`: one instance serves all request threads.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use crate::chat_template::{ChatTemplate, ChatTemplateConfig, SpecialTokenStrings};
use crate::error::{Result, TokenizerError};
use crate::fim::FimTokens;
use crate::gguf_vocab::GgufVocab;
use crate::hf_config::{self, HfTokenizerConfig};
use crate::sandbox::SandboxLauncher;
use crate::{gguf_backend, gguf_spm};

/// Texts of special tokens that end an assistant turn in common chat formats.
pub const END_OF_TURN_MARKERS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|return|>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
    // MiniMax-M2's end of message.
    "[e~[",
];

/// The files of a Hugging Face tokenizer.
#[derive(Debug, Clone, Default)]
pub struct HfTokenizerFiles {
    /// `tokenizer.json` (required).
    pub tokenizer_json: PathBuf,
    /// `tokenizer_config.json`: chat template, special-token strings.
    pub tokenizer_config: Option<PathBuf>,
    /// `chat_template.jinja`: newer transformers save the template here; it wins over
    /// the one in tokenizer_config.json, as in transformers.
    pub chat_template: Option<PathBuf>,
    /// `generation_config.json`: extra end-of-generation ids.
    pub generation_config: Option<PathBuf>,
}

impl HfTokenizerFiles {
    /// The files present in a model folder; only `tokenizer.json` must exist.
    pub fn from_dir(dir: &Path) -> Self {
        let existing = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
        HfTokenizerFiles {
            tokenizer_json: dir.join("tokenizer.json"),
            tokenizer_config: existing("tokenizer_config.json"),
            chat_template: existing("chat_template.jinja"),
            generation_config: existing("generation_config.json"),
        }
    }
}

/// A model's tokenizer, chat template and special ids.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
    special_ids: HashSet<u32>,
    /// BOS/EOS added by `encode(.., true)` outside the backend (GGUF path); the HF path
    /// leaves that to tokenizer.json's post-processor.
    add_bos_id: Option<u32>,
    add_eos_id: Option<u32>,
    clean_up_tokenization_spaces: bool,
    special_strings: SpecialTokenStrings,
    fim: Option<FimTokens>,
    chat_template: Option<std::result::Result<ChatTemplate, String>>,
    /// Bytes the byte-level vocabulary has no token for (GGUF path; none for
    /// tokenizer.json, whose pipeline handles them itself).
    unrepresentable: [bool; 256],
    /// Length of the longest token's text in the vocabulary, added tokens included.
    longest_token_bytes: usize,
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes: byte-level BPE (`gpt2`) or
    /// SentencePiece (`llama`).
    pub fn from_gguf(vocab: &GgufVocab) -> Result<Self> {
        let (inner, unrepresentable) = match vocab.model.as_str() {
            "llama" => (
                gguf_spm::build_spm_backend(vocab)?,
                gguf_spm::unrepresentable_spm_bytes(vocab),
            ),
            _ => (
                gguf_backend::build_backend(vocab)?,
                gguf_backend::unrepresentable_bytes(vocab),
            ),
        };
        let text = |id: Option<u32>| id.and_then(|id| vocab.tokens.get(id as usize).cloned());
        let special_strings = SpecialTokenStrings {
            bos_token: text(vocab.bos_token_id),
            eos_token: text(vocab.eos_token_id),
            unk_token: text(vocab.unknown_token_id),
            pad_token: text(vocab.padding_token_id),
        };
        let declared_eos = [vocab.eos_token_id, vocab.eot_token_id, vocab.eom_token_id];
        let parts = Parts {
            bos_token_id: vocab.bos_token_id,
            declared_eos: declared_eos.into_iter().flatten().collect(),
            add_bos_id: vocab
                .bos_token_id
                .filter(|_| vocab.add_bos_token.unwrap_or(false)),
            add_eos_id: vocab
                .eos_token_id
                .filter(|_| vocab.add_eos_token.unwrap_or(false)),
            clean_up_tokenization_spaces: false,
            special_strings,
            fim: vocab.fim,
            chat_template: vocab.chat_template.clone(),
        };
        let mut tokenizer = Self::assemble(inner, parts);
        tokenizer.unrepresentable = unrepresentable;
        Ok(tokenizer)
    }

    /// Builds from Hugging Face files.
    pub fn from_hf_files(files: &HfTokenizerFiles) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(&files.tokenizer_json).map_err(|e| {
            TokenizerError::Backend(format!("{}: {e}", files.tokenizer_json.display()))
        })?;
        let config = match &files.tokenizer_config {
            Some(path) => HfTokenizerConfig::from_file(path)?,
            None => HfTokenizerConfig::default(),
        };
        let mut chat_template = config.chat_template.clone();
        if let Some(path) = &files.chat_template {
            let source = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
                path: path.clone(),
                source,
            })?;
            chat_template = Some(source);
        }
        let mut declared_eos = Vec::new();
        declared_eos.extend(
            config
                .eos_token
                .as_deref()
                .and_then(|t| inner.token_to_id(t)),
        );
        if let Some(path) = &files.generation_config {
            declared_eos.extend(hf_config::generation_eos_ids(path)?);
        }
        let parts = Parts {
            bos_token_id: config
                .bos_token
                .as_deref()
                .and_then(|t| inner.token_to_id(t)),
            declared_eos,
            add_bos_id: None,
            add_eos_id: None,
            clean_up_tokenization_spaces: config.clean_up_tokenization_spaces,
            special_strings: SpecialTokenStrings {
                bos_token: config.bos_token,
                eos_token: config.eos_token,
                unk_token: config.unk_token,
                pad_token: config.pad_token,
            },
            fim: None,
            chat_template,
        };
        Ok(Self::assemble(inner, parts))
    }

    /// Builds from a model folder holding `tokenizer.json` and optionally
    /// `tokenizer_config.json`, `chat_template.jinja`, `generation_config.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        Self::from_hf_files(&HfTokenizerFiles::from_dir(dir))
    }

    fn assemble(inner: tokenizers::Tokenizer, parts: Parts) -> Self {
        let special_ids: HashSet<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        let mut eos: BTreeSet<u32> = parts.declared_eos.into_iter().collect();
        for marker in END_OF_TURN_MARKERS {
            if let Some(id) = inner.token_to_id(marker) {
                if special_ids.contains(&id) {
                    eos.insert(id);
                }
            }
        }
        let fim = parts
            .fim
            .or_else(|| FimTokens::find(|text| inner.token_to_id(text)));
        let chat_template = parts.chat_template.map(|source| {
            ChatTemplate::new(
                &source,
                parts.special_strings.clone(),
                &ChatTemplateConfig::default(),
            )
            .map_err(|e| e.to_string())
        });
        let longest_token_bytes = inner
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(1);
        Tokenizer {
            inner,
            longest_token_bytes,
            bos_token_id: parts.bos_token_id,
            eos_token_ids: eos.into_iter().collect(),
            special_ids,
            add_bos_id: parts.add_bos_id,
            add_eos_id: parts.add_eos_id,
            clean_up_tokenization_spaces: parts.clean_up_tokenization_spaces,
            special_strings: parts.special_strings,
            fim,
            chat_template,
            unrepresentable: [false; 256],
        }
    }

    /// Replaces the chat template (e.g. from a `--chat-template` file), compiling it with
    /// `config`.
    pub fn set_chat_template(&mut self, source: &str, config: &ChatTemplateConfig) -> Result<()> {
        let template = ChatTemplate::new(source, self.special_strings.clone(), config)?;
        self.chat_template = Some(Ok(template));
        Ok(())
    }

    /// Text to ids. Special tokens written in `text` become their ids either way;
    /// `add_special_tokens` adds what the model adds around a sequence (BOS for Llama).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        if let Some(&byte) = text
            .as_bytes()
            .iter()
            .find(|b| self.unrepresentable[usize::from(**b)])
        {
            return Err(TokenizerError::Unrepresentable { byte });
        }
        // The GGUF backend has no post-processor, so this only matters for tokenizer.json.
        let encoding = self.inner.encode_fast(text, add_special_tokens)?;
        let body = encoding.get_ids();
        if !add_special_tokens {
            return Ok(body.to_vec());
        }
        let mut ids = Vec::with_capacity(body.len() + 2);
        ids.extend(self.add_bos_id);
        ids.extend_from_slice(body);
        ids.extend(self.add_eos_id);
        Ok(ids)
    }

    /// The prompt that asks a code model for the text between `prefix` and `suffix`: the
    /// BOS the model adds to a sequence, then each part encoded as `encode(.., false)`
    /// encodes it, placed around the vocabulary's fill-in-the-middle sentinels
    /// ([`FimTokens`]). `NoFimTokens` when the vocabulary has none.
    pub fn encode_infill(&self, prefix: &str, suffix: &str) -> Result<Vec<u32>> {
        let fim = self.fim.ok_or(TokenizerError::NoFimTokens)?;
        let lead: Vec<u32> = self
            .encode("", true)?
            .into_iter()
            .take_while(|&id| Some(id) == self.bos_token_id)
            .collect();
        let prefix = self.encode(prefix, false)?;
        let suffix = self.encode(suffix, false)?;
        Ok(fim.assemble(&lead, &prefix, &suffix))
    }

    /// The ids of [`crate::fim::INFILL_END_MARKERS`] this vocabulary has: with its end of
    /// sequence, what ends an infill.
    pub fn infill_end_ids(&self) -> Vec<u32> {
        crate::fim::INFILL_END_MARKERS
            .iter()
            .filter_map(|text| self.inner.token_to_id(text))
            .collect()
    }

    /// The vocabulary's fill-in-the-middle sentinels, when it has them.
    pub fn fim_tokens(&self) -> Option<FimTokens> {
        self.fim
    }

    /// Ids to text. With `skip_special_tokens`, special tokens (`<|im_end|>`) are dropped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let text = self.inner.decode(ids, skip_special_tokens)?;
        Ok(if self.clean_up_tokenization_spaces {
            clean_up_tokenization(&text)
        } else {
            text
        })
    }

    /// Length in bytes of the vocabulary's longest token text.
    pub fn longest_token_bytes(&self) -> usize {
        self.longest_token_bytes
    }

    /// Whether the pipeline normalizes text before splitting it.
    pub fn has_normalizer(&self) -> bool {
        self.inner.get_normalizer().is_some()
    }

    /// The id of the BOS token, if the model has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// All ids that end generation, sorted (see the module docs for the rule).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Whether `id` is a special token (skipped by `decode(.., true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// The number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token's text (the vocabulary form, e.g. `Ġthe`), or of an added token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary text of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The special-token strings given to the chat template.
    pub fn special_token_strings(&self) -> &SpecialTokenStrings {
        &self.special_strings
    }

    /// The compiled chat template: `NoChatTemplate` when the model has none, `Template`
    /// when it failed to compile.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        match &self.chat_template {
            None => Err(TokenizerError::NoChatTemplate),
            Some(Ok(template)) => Ok(template),
            Some(Err(message)) => Err(TokenizerError::Template(message.clone())),
        }
    }

    /// Replaces the model's chat template with `source` (a Jinja template, as in
    /// `tokenizer_config.json`); an error when it does not compile.
    pub fn with_chat_template(mut self, source: &str) -> Result<Self> {
        let template = ChatTemplate::new(
            source,
            self.special_strings.clone(),
            &ChatTemplateConfig::default(),
        )?;
        self.chat_template = Some(Ok(template));
        Ok(self)
    }

    /// Renders the chat template (when there is one) in sandbox processes from now on; see
    /// [`crate::sandbox`].
    pub fn isolate_chat_template(&mut self, launcher: SandboxLauncher) -> Result<()> {
        match &mut self.chat_template {
            Some(Ok(template)) => template.isolate(launcher),
            _ => Ok(()),
        }
    }

    /// The underlying Hugging Face tokenizer.
    pub fn backend(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// A summary: the backend's own `Debug` would print the whole vocabulary.
impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("add_bos_id", &self.add_bos_id)
            .field("add_eos_id", &self.add_eos_id)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}

/// What a constructor gathered before assembly.
struct Parts {
    bos_token_id: Option<u32>,
    declared_eos: Vec<u32>,
    add_bos_id: Option<u32>,
    add_eos_id: Option<u32>,
    clean_up_tokenization_spaces: bool,
    special_strings: SpecialTokenStrings,
    /// Sentinels the model files name; found by their text otherwise.
    fim: Option<FimTokens>,
    chat_template: Option<String>,
}

/// transformers' `clean_up_tokenization`: drops the space English BPE leaves before
/// punctuation and contractions.
fn clean_up_tokenization(text: &str) -> String {
    text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}
