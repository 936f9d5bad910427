//! A reasoning model's thinking, split from its answer: the text between `<think>` and
//! `</think>` (Qwen3, DeepSeek-R1 and their distillations), or gpt-oss's `analysis`
//! channel (`reasoning_harmony.rs`), goes to the reply's `reasoning` (and
//! `reasoning_content`, the older name clients still read), the rest to its `content`.
//! The split is streamed: text is held back only while it may still be part of a tag.

use std::fmt;
use std::str::FromStr;

use super::harmony::{HarmonySplit, CHANNEL};
use super::split::Split;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// The thinking block's markers, which some vocabularies (GLM's) hold as special tokens:
/// the detokenizer keeps them for the split to read.
pub const THINK_MARKERS: [&str; 2] = [OPEN, CLOSE];

/// How one request's replies are split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplySplit {
    /// At `<think>` / `</think>`; `open`: the prompt opened the block, so the reply starts
    /// inside it ([`prompt_opens_thinking`]).
    Think { open: bool },
    /// By OpenAI's harmony channels (gpt-oss).
    Harmony,
}

/// `--reasoning-parser`: whether replies are split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningParser {
    /// Split when the chat template knows `<think>` (it writes or strips such blocks).
    #[default]
    Auto,
    /// Never split: the thinking stays in `content`.
    None,
    /// Split at `<think>` / `</think>` (vLLM's `qwen3` and `deepseek_r1` parsers).
    Think,
    /// Split by harmony channels: `analysis` is thinking, `final` the answer (gpt-oss;
    /// vLLM's `openai_gptoss`).
    Harmony,
}

impl FromStr for ReasoningParser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ReasoningParser::Auto),
            "none" => Ok(ReasoningParser::None),
            "think" | "qwen3" | "deepseek_r1" => Ok(ReasoningParser::Think),
            "harmony" | "openai_gptoss" => Ok(ReasoningParser::Harmony),
            other => Err(format!(
                "unknown reasoning parser `{other}`: use auto, none, think or harmony (qwen3 \
                 and deepseek_r1 are names for think, openai_gptoss for harmony)"
            )),
        }
    }
}

impl fmt::Display for ReasoningParser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReasoningParser::Auto => "auto",
            ReasoningParser::None => "none",
            ReasoningParser::Think => "think",
            ReasoningParser::Harmony => "harmony",
        })
    }
}

impl ReasoningParser {
    /// How replies to `prompt`, rendered by the template `source`, are split (`None`: not
    /// at all). `auto` splits by harmony channels when the template writes them, at
    /// `<think>` when it knows such blocks.
    pub fn reply_split(self, template_source: &str, prompt: &str) -> Option<ReplySplit> {
        let think = ReplySplit::Think {
            open: prompt_opens_thinking(prompt),
        };
        match self {
            ReasoningParser::Auto if template_source.contains(CHANNEL) => Some(ReplySplit::Harmony),
            ReasoningParser::Auto => template_source.contains(OPEN).then_some(think),
            ReasoningParser::None => None,
            ReasoningParser::Think => Some(think),
            ReasoningParser::Harmony => Some(ReplySplit::Harmony),
        }
    }
}

/// Whether a reply to `prompt` starts inside a thinking block: the prompt ends with an
/// open `<think>` (DeepSeek-R1's templates open it for the model).
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before anything but whitespace: a `<think>` here opens a thinking block.
    Start,
    /// Right after `<think>`: newlines before the thinking are dropped.
    ThinkingStart,
    Thinking,
    /// After `</think>`: newlines before the answer are dropped.
    AnswerStart,
    Answer,
}

/// The split of one reply, fed as it streams.
#[derive(Debug, Clone)]
pub enum ReasoningSplit {
    Think(ThinkSplit),
    Harmony(HarmonySplit),
}

impl ReasoningSplit {
    pub fn new(how: ReplySplit) -> Self {
        match how {
            ReplySplit::Think { open } => ReasoningSplit::Think(ThinkSplit::new(open)),
            ReplySplit::Harmony => ReasoningSplit::Harmony(HarmonySplit::default()),
        }
    }

    /// The split of the text so far that can no longer change.
    pub fn push(&mut self, text: &str) -> Split {
        match self {
            ReasoningSplit::Think(s) => s.push(text),
            ReasoningSplit::Harmony(s) => s.push(text),
        }
    }

    /// The rest, once the reply ended.
    pub fn finish(&mut self) -> Split {
        match self {
            ReasoningSplit::Think(s) => s.finish(),
            ReasoningSplit::Harmony(s) => s.finish(),
        }
    }

    /// [`ReasoningSplit::push`] of the reply's last text, then [`ReasoningSplit::finish`].
    pub fn push_last(&mut self, text: &str) -> Split {
        let mut out = self.push(text);
        let rest = self.finish();
        out.reasoning.push_str(&rest.reasoning);
        out.content.push_str(&rest.content);
        out
    }

    /// A whole reply's split.
    pub fn whole(how: ReplySplit, text: &str) -> Split {
        ReasoningSplit::new(how).push_last(text)
    }
}

/// The split at `<think>` tags of one reply.
#[derive(Debug, Clone)]
pub struct ThinkSplit {
    state: State,
    pending: String,
}

impl ThinkSplit {
    /// `thinking`: the reply starts inside a thinking block ([`prompt_opens_thinking`]).
    fn new(thinking: bool) -> Self {
        ThinkSplit {
            state: if thinking {
                State::ThinkingStart
            } else {
                State::Start
            },
            pending: String::new(),
        }
    }

    /// The split of the text so far that can no longer change.
    fn push(&mut self, text: &str) -> Split {
        self.pending.push_str(text);
        let mut out = Split::default();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.pending = rest.to_string();
                        self.state = State::ThinkingStart;
                    } else if OPEN.starts_with(trimmed) {
                        // Only whitespace or the start of `<think>` so far.
                        return out;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::ThinkingStart => {
                    if !self.skip_newlines(State::Thinking) {
                        return out;
                    }
                }
                State::Thinking => {
                    if let Some(at) = self.pending.find(CLOSE) {
                        let rest = self.pending.split_off(at);
                        out.reasoning.push_str(self.pending.trim_end_matches('\n'));
                        self.pending = rest[CLOSE.len()..].to_string();
                        self.state = State::AnswerStart;
                    } else {
                        let keep = held_before_close(&self.pending);
                        let released = self.pending.len() - keep;
                        let held = self.pending.split_off(released);
                        out.reasoning.push_str(&self.pending);
                        self.pending = held;
                        return out;
                    }
                }
                State::AnswerStart => {
                    if !self.skip_newlines(State::Answer) {
                        return out;
                    }
                }
                State::Answer => {
                    out.content.push_str(&self.pending);
                    self.pending.clear();
                    return out;
                }
            }
        }
    }

    /// Drops the pending text's leading newlines; once other text follows them, moves to
    /// `next` and returns true.
    fn skip_newlines(&mut self, next: State) -> bool {
        let rest = self.pending.trim_start_matches('\n');
        if rest.is_empty() {
            self.pending.clear();
            return false;
        }
        self.pending = rest.to_string();
        self.state = next;
        true
    }

    /// The rest, once the reply ended: unclosed thinking is thinking, anything held
    /// before the start is answer.
    fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Thinking => Split {
                reasoning: rest.trim_end_matches('\n').to_string(),
                content: String::new(),
            },
            State::ThinkingStart | State::AnswerStart => Split::default(),
            State::Start | State::Answer => Split {
                reasoning: String::new(),
                content: rest,
            },
        }
    }
}

/// Length of the suffix of thinking text to hold back: newlines, then a proper prefix of
/// `</think>` (both may turn out to precede the close tag).
fn held_before_close(text: &str) -> usize {
    let tag = (1..CLOSE.len())
        .rev()
        .find(|&n| text.ends_with(&CLOSE[..n]))
        .unwrap_or(0);
    let before = &text[..text.len() - tag];
    tag + (before.len() - before.trim_end_matches('\n').len())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn split(reasoning: &str, content: &str) -> Split {
        Split {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    /// The split of `text` fed in pieces of every size from 1 to its length equals the
    /// whole one.
    pub(crate) fn streamed_as_whole(how: ReplySplit, text: &str) -> Split {
        let whole = ReasoningSplit::whole(how, text);
        let chars: Vec<char> = text.chars().collect();
        for size in 1..=chars.len().max(1) {
            let mut s = ReasoningSplit::new(how);
            let mut got = Split::default();
            for piece in chars.chunks(size) {
                let out = s.push(&piece.iter().collect::<String>());
                got.reasoning.push_str(&out.reasoning);
                got.content.push_str(&out.content);
            }
            let out = s.finish();
            got.reasoning.push_str(&out.reasoning);
            got.content.push_str(&out.content);
            assert_eq!(got, whole, "{text:?} in pieces of {size}");
        }
        whole
    }

    #[test]
    fn thinking_and_answer_are_split_streamed_or_whole() {
        let cases = [
            (
                false,
                "<think>\nLet me see.\n</think>\n\nParis.",
                split("Let me see.", "Paris."),
            ),
            (false, "  <think>a < b</think>b", split("a < b", "b")),
            // Thinking turned off: the template wrote an empty block in the prompt.
            (false, "Paris.", split("", "Paris.")),
            (false, "<thin", split("", "<thin")),
            (false, "I <think> so", split("", "I <think> so")),
            // DeepSeek-R1: the prompt opened the block.
            (true, "Hmm.\n</think>\n\nYes.", split("Hmm.", "Yes.")),
            (
                true,
                "cut off by max_tokens </thi",
                split("cut off by max_tokens </thi", ""),
            ),
            (false, "<think>\n\n</think>\n\n", split("", "")),
            (
                false,
                "<think>x</think>a\n\nb</think>",
                split("x", "a\n\nb</think>"),
            ),
        ];
        for (open, text, want) in cases {
            let how = ReplySplit::Think { open };
            assert_eq!(streamed_as_whole(how, text), want, "{text:?}");
        }
    }

    #[test]
    fn newlines_inside_the_thinking_are_kept() {
        let mut s = ReasoningSplit::new(ReplySplit::Think { open: false });
        assert_eq!(s.push("<think>\none").reasoning, "one");
        assert_eq!(s.push("\n").reasoning, "");
        assert_eq!(s.push("\ntwo").reasoning, "\n\ntwo");
        assert_eq!(s.push("\n</think>\nok").content, "ok");
    }

    #[test]
    fn parser_names() {
        for (name, parser) in [
            ("auto", ReasoningParser::Auto),
            ("none", ReasoningParser::None),
            ("qwen3", ReasoningParser::Think),
            ("deepseek_r1", ReasoningParser::Think),
            ("harmony", ReasoningParser::Harmony),
            ("openai_gptoss", ReasoningParser::Harmony),
        ] {
            assert_eq!(name.parse::<ReasoningParser>(), Ok(parser));
        }
        assert!("granite".parse::<ReasoningParser>().is_err());
    }

    #[test]
    fn which_templates_and_prompts_think() {
        let split = |p: ReasoningParser, template: &str| p.reply_split(template, "");
        let think = Some(ReplySplit::Think { open: false });
        let harmony = Some(ReplySplit::Harmony);
        assert_eq!(
            split(ReasoningParser::Auto, "{% if '<think>' in content %}"),
            think
        );
        assert_eq!(split(ReasoningParser::Auto, "{{ messages }}"), None);
        assert_eq!(split(ReasoningParser::None, "<think>"), None);
        assert_eq!(split(ReasoningParser::Think, ""), think);
        assert_eq!(
            split(
                ReasoningParser::Auto,
                "{{- '<|channel|>final<|message|>' }}"
            ),
            harmony
        );
        assert_eq!(split(ReasoningParser::Harmony, "<think>"), harmony);
        assert_eq!(
            ReasoningParser::Auto.reply_split("<think>", "<|Assistant|><think>\n"),
            Some(ReplySplit::Think { open: true })
        );
        assert!(prompt_opens_thinking("<|Assistant|><think>\n"));
        assert!(!prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
    }
}
