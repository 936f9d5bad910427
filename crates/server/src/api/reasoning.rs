//! A reasoning model's thinking, split from its answer: the text between `<think>` and
//! `</think>` (Qwen3, DeepSeek-R1 and their distillations) goes to the reply's
//! `reasoning` (and `reasoning_content`, the older name clients still read), the rest to
//! its `content`. The split is streamed: text is held back only while it may still be
//! part of a tag.

use std::fmt;
use std::str::FromStr;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

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
}

impl FromStr for ReasoningParser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ReasoningParser::Auto),
            "none" => Ok(ReasoningParser::None),
            "think" | "qwen3" | "deepseek_r1" => Ok(ReasoningParser::Think),
            other => Err(format!(
                "unknown reasoning parser `{other}`: use auto, none or think (qwen3 and \
                 deepseek_r1 are names for think)"
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
        })
    }
}

impl ReasoningParser {
    /// Whether replies to prompts of the template `source` are split.
    pub fn splits(self, template_source: &str) -> bool {
        match self {
            ReasoningParser::Auto => template_source.contains(OPEN),
            ReasoningParser::None => false,
            ReasoningParser::Think => true,
        }
    }
}

/// Whether a reply to `prompt` starts inside a thinking block: the prompt ends with an
/// open `<think>` (DeepSeek-R1's templates open it for the model).
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// Text split into thinking and answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
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
pub struct ReasoningSplit {
    state: State,
    pending: String,
}

impl ReasoningSplit {
    /// `thinking`: the reply starts inside a thinking block ([`prompt_opens_thinking`]).
    pub fn new(thinking: bool) -> Self {
        ReasoningSplit {
            state: if thinking {
                State::ThinkingStart
            } else {
                State::Start
            },
            pending: String::new(),
        }
    }

    /// The split of the text so far that can no longer change.
    pub fn push(&mut self, text: &str) -> Split {
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

    /// [`ReasoningSplit::push`] of the reply's last text, then [`ReasoningSplit::finish`].
    pub fn push_last(&mut self, text: &str) -> Split {
        let mut out = self.push(text);
        let rest = self.finish();
        out.reasoning.push_str(&rest.reasoning);
        out.content.push_str(&rest.content);
        out
    }

    /// The rest, once the reply ended: unclosed thinking is thinking, anything held
    /// before the start is answer.
    pub fn finish(&mut self) -> Split {
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

    /// A whole reply's split.
    pub fn whole(thinking: bool, text: &str) -> Split {
        ReasoningSplit::new(thinking).push_last(text)
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
mod tests {
    use super::*;

    fn split(reasoning: &str, content: &str) -> Split {
        Split {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    /// The split of `text` fed in pieces of every size from 1 to its length equals the
    /// whole one.
    fn streamed_as_whole(thinking: bool, text: &str) -> Split {
        let whole = ReasoningSplit::whole(thinking, text);
        let chars: Vec<char> = text.chars().collect();
        for size in 1..=chars.len().max(1) {
            let mut s = ReasoningSplit::new(thinking);
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
        for (thinking, text, want) in cases {
            assert_eq!(streamed_as_whole(thinking, text), want, "{text:?}");
        }
    }

    #[test]
    fn newlines_inside_the_thinking_are_kept() {
        let mut s = ReasoningSplit::new(false);
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
        ] {
            assert_eq!(name.parse::<ReasoningParser>(), Ok(parser));
        }
        assert!("granite".parse::<ReasoningParser>().is_err());
    }

    #[test]
    fn which_templates_and_prompts_think() {
        assert!(ReasoningParser::Auto.splits("{% if '<think>' in content %}"));
        assert!(!ReasoningParser::Auto.splits("{{ messages }}"));
        assert!(!ReasoningParser::None.splits("<think>"));
        assert!(ReasoningParser::Think.splits(""));
        assert!(prompt_opens_thinking("<|Assistant|><think>\n"));
        assert!(!prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
    }
}
