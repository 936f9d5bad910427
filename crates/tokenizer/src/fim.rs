//! Fill-in-the-middle: the sentinel tokens a code model was trained with to write the text
//! that goes between a prefix and a suffix, and the prompt they make.
//!
//! Two layouts are in use:
//! * prefix first (StarCoder, Qwen2.5-Coder, CodeLlama, DeepSeek-Coder, CodeGemma,
//!   GLM-4): `[BOS] PRE prefix SUF suffix MID`, the model writing after `MID`;
//! * suffix first (Mistral's Codestral, as `mistral-common` encodes it):
//!   `[BOS] SUFFIX suffix PREFIX prefix`, the model writing after the prefix.
//!
//! GGUF files may name the ids (`tokenizer.ggml.fim_pre_token_id` and its siblings, as
//! llama.cpp's converter writes them); otherwise the sentinels are found by their text.

/// Where the prefix goes relative to the suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FimOrder {
    /// `PRE prefix SUF suffix MID`.
    PrefixFirst,
    /// `SUF suffix PRE prefix`.
    SuffixFirst,
}

/// A vocabulary's fill-in-the-middle sentinels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FimTokens {
    pub prefix: u32,
    pub suffix: u32,
    /// The token after which the model writes; none in the suffix-first layout.
    pub middle: Option<u32>,
    pub order: FimOrder,
}

/// Known spellings: prefix, suffix, middle (empty: the layout has none), layout.
const SPELLINGS: &[(&str, &str, &str, FimOrder)] = &[
    // Qwen2.5-Coder, Qwen3-Coder, CodeGemma.
    (
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        FimOrder::PrefixFirst,
    ),
    // StarCoder, StarCoder2, SantaCoder, Granite Code.
    (
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        FimOrder::PrefixFirst,
    ),
    (
        "<fim-prefix>",
        "<fim-suffix>",
        "<fim-middle>",
        FimOrder::PrefixFirst,
    ),
    // CodeLlama (SentencePiece pieces with and without the word marker).
    ("▁<PRE>", "▁<SUF>", "▁<MID>", FimOrder::PrefixFirst),
    ("<PRE>", "<SUF>", "<MID>", FimOrder::PrefixFirst),
    // DeepSeek-Coder.
    (
        "<｜fim▁begin｜>",
        "<｜fim▁hole｜>",
        "<｜fim▁end｜>",
        FimOrder::PrefixFirst,
    ),
    // GLM-4.
    (
        "<|code_prefix|>",
        "<|code_suffix|>",
        "<|code_middle|>",
        FimOrder::PrefixFirst,
    ),
    // Mistral (Codestral).
    ("[PREFIX]", "[SUFFIX]", "", FimOrder::SuffixFirst),
];

/// Tokens that end an infill besides the model's end of sequence: the padding and the
/// file and repository separators of fill-in-the-middle training data, and CodeLlama's
/// end of infill (llama.cpp ends generation on the same).
pub const INFILL_END_MARKERS: &[&str] = &[
    "<|fim_pad|>",
    "<|file_sep|>",
    "<|repo_name|>",
    "<fim_pad>",
    "<file_sep>",
    "<repo_name>",
    "▁<EOT>",
    "<EOT>",
];

impl FimTokens {
    /// The first known spelling whose every sentinel `lookup` finds.
    pub fn find(lookup: impl Fn(&str) -> Option<u32>) -> Option<Self> {
        SPELLINGS.iter().find_map(|&(pre, suf, mid, order)| {
            let middle = match mid {
                "" => None,
                text => Some(lookup(text)?),
            };
            Some(FimTokens {
                prefix: lookup(pre)?,
                suffix: lookup(suf)?,
                middle,
                order,
            })
        })
    }

    /// The prompt's ids: `lead` (the BOS the model adds to a sequence, or nothing), then
    /// the encoded parts around the sentinels in this vocabulary's layout.
    pub fn assemble(&self, lead: &[u32], prefix: &[u32], suffix: &[u32]) -> Vec<u32> {
        let mut ids = Vec::with_capacity(lead.len() + prefix.len() + suffix.len() + 3);
        ids.extend_from_slice(lead);
        match self.order {
            FimOrder::PrefixFirst => {
                ids.push(self.prefix);
                ids.extend_from_slice(prefix);
                ids.push(self.suffix);
                ids.extend_from_slice(suffix);
            }
            FimOrder::SuffixFirst => {
                ids.push(self.suffix);
                ids.extend_from_slice(suffix);
                ids.push(self.prefix);
                ids.extend_from_slice(prefix);
            }
        }
        ids.extend(self.middle);
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab<'a>(tokens: &'a [&'a str]) -> impl Fn(&str) -> Option<u32> + 'a {
        move |text| tokens.iter().position(|t| *t == text).map(|i| i as u32)
    }

    #[test]
    fn finds_each_family_by_text() {
        let qwen = ["a", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"];
        assert_eq!(
            FimTokens::find(vocab(&qwen)),
            Some(FimTokens {
                prefix: 1,
                suffix: 3,
                middle: Some(2),
                order: FimOrder::PrefixFirst
            })
        );
        let codellama = ["<s>", "▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"];
        let found = FimTokens::find(vocab(&codellama)).unwrap();
        assert_eq!((found.prefix, found.suffix, found.middle), (1, 2, Some(3)));
        let mistral = ["<s>", "[PREFIX]", "[MIDDLE]", "[SUFFIX]"];
        let found = FimTokens::find(vocab(&mistral)).unwrap();
        assert_eq!((found.prefix, found.suffix, found.middle), (1, 3, None));
        assert_eq!(found.order, FimOrder::SuffixFirst);
    }

    #[test]
    fn a_partial_set_is_no_set() {
        // Two of three, or sentinels of different families, are not a layout.
        assert_eq!(
            FimTokens::find(vocab(&["<|fim_prefix|>", "<|fim_suffix|>"])),
            None
        );
        assert_eq!(
            FimTokens::find(vocab(&["<fim_prefix>", "<|fim_suffix|>", "<fim_middle>"])),
            None
        );
        assert_eq!(FimTokens::find(vocab(&["a", "b"])), None);
    }

    #[test]
    fn assembles_both_layouts() {
        let psm = FimTokens {
            prefix: 100,
            suffix: 101,
            middle: Some(102),
            order: FimOrder::PrefixFirst,
        };
        assert_eq!(
            psm.assemble(&[1], &[5, 6], &[7]),
            vec![1, 100, 5, 6, 101, 7, 102]
        );
        let spm = FimTokens {
            prefix: 11,
            suffix: 13,
            middle: None,
            order: FimOrder::SuffixFirst,
        };
        assert_eq!(spm.assemble(&[1], &[5, 6], &[7]), vec![1, 13, 7, 11, 5, 6]);
        assert_eq!(spm.assemble(&[], &[], &[]), vec![13, 11]);
    }
}
