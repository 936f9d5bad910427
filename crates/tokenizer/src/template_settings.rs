//! What a chat template is compiled with: its limits and the special-token strings it
//! may refer to. Shared by the template and the sandbox processes that render it.

/// Limits that keep a hostile or broken template from hanging a request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatTemplateConfig {
    /// minijinja instructions one render may execute. A ChatML render costs tens of
    /// instructions per message, so the default allows very long chats.
    pub fuel: u64,
    /// Nesting depth (loops, macro calls, includes) before rendering fails. minijinja caps
    /// this at 500 without its `stacker` feature.
    pub recursion_limit: usize,
    /// Largest rendered prompt, in bytes.
    pub max_output_bytes: usize,
}

impl Default for ChatTemplateConfig {
    fn default() -> Self {
        ChatTemplateConfig {
            fuel: 5_000_000,
            recursion_limit: 200,
            max_output_bytes: 32 << 20,
        }
    }
}

/// Special-token strings the template can refer to (`bos_token`, `eos_token`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpecialTokenStrings {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
}
