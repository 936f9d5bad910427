//! One call object, `{"name": "f", "arguments": {...}}`, read as its text streams in.
//!
//! The name is known once its string closes; the arguments value is passed on as raw
//! JSON text, fragment by fragment, as soon as the name is known (arguments written
//! before the name wait for it). Only the top level of the object is parsed: nested
//! values are tracked by depth and string state, so their text is copied as written.
//! Structural characters are ASCII, so scanning bytes never splits a UTF-8 character.

use crate::api::tools::parsers::value_scan::StringState;

/// What a call object produced since the last [`CallObject::take`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CallProgress {
    /// The function name, given once, as soon as it is known.
    pub name: Option<String>,
    /// More of the arguments text.
    pub arguments: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    ExpectKey,
    InKey { start: usize },
    ExpectColon,
    ExpectValue,
    InValue { start: usize, string: bool },
    AfterValue,
}

/// The scanner of one call object.
#[derive(Debug)]
pub struct CallObject {
    text: String,
    scanned: usize,
    started: bool,
    invalid: bool,
    depth: usize,
    string: StringState,
    phase: Phase,
    key: String,
    name: Option<String>,
    name_given: bool,
    /// Byte range of the arguments value; the end once the value is complete.
    arguments: Option<(usize, Option<usize>)>,
    arguments_given: usize,
    /// Byte offset just past the closing brace.
    end: Option<usize>,
}

/// Keys whose value is the arguments (`parameters` in Llama 3's form).
const ARGUMENT_KEYS: [&str; 2] = ["arguments", "parameters"];

impl Default for CallObject {
    fn default() -> Self {
        Self::new()
    }
}

impl CallObject {
    pub fn new() -> Self {
        CallObject {
            text: String::new(),
            scanned: 0,
            started: false,
            invalid: false,
            depth: 0,
            string: StringState::default(),
            phase: Phase::ExpectKey,
            key: String::new(),
            name: None,
            name_given: false,
            arguments: None,
            arguments_given: 0,
            end: None,
        }
    }

    /// Reads `text`; returns how many of its bytes belong to this object (all of them
    /// until the closing brace).
    pub fn feed(&mut self, text: &str) -> usize {
        if self.end.is_some() || self.invalid {
            return 0;
        }
        let base = self.text.len();
        self.text.push_str(text);
        while self.scanned < self.text.len() && self.end.is_none() && !self.invalid {
            let i = self.scanned;
            let b = self.text.as_bytes()[i];
            self.scanned += 1;
            self.step(i, b);
        }
        match self.end {
            Some(end) => {
                self.text.truncate(end);
                end - base
            }
            None => text.len(),
        }
    }

    /// The text does not open an object (its first non-space character is not `{`).
    pub fn is_invalid(&self) -> bool {
        self.invalid
    }

    /// The closing brace was read.
    pub fn is_complete(&self) -> bool {
        self.end.is_some()
    }

    /// Whether the name has been given out by [`take`](Self::take).
    pub fn has_started(&self) -> bool {
        self.name_given
    }

    /// The object's text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The name (once known and not yet given) and the arguments text not yet given.
    /// Nothing is given before the name; a complete object without arguments gives
    /// `{}`.
    pub fn take(&mut self) -> CallProgress {
        let mut progress = CallProgress::default();
        let Some(name) = &self.name else {
            return progress;
        };
        if !self.name_given {
            self.name_given = true;
            progress.name = Some(name.clone());
        }
        match self.arguments {
            Some((start, end)) => {
                let end = end.unwrap_or(self.text.len());
                let from = start.max(self.arguments_given);
                if from < end {
                    progress.arguments = self.text[from..end].to_string();
                    self.arguments_given = end;
                }
            }
            None if self.end.is_some() && self.arguments_given == 0 => {
                progress.arguments = "{}".to_string();
                self.arguments_given = 2;
            }
            None => {}
        }
        progress
    }

    fn step(&mut self, i: usize, b: u8) {
        if !self.started {
            match b {
                b'{' => {
                    self.started = true;
                    self.depth = 1;
                }
                b if b.is_ascii_whitespace() => {}
                _ => self.invalid = true,
            }
            return;
        }
        if let Some(closed) = self.string.read(b) {
            if closed && self.depth == 1 {
                match self.phase {
                    Phase::InKey { start } => {
                        self.key = self.text[start + 1..i].to_string();
                        self.phase = Phase::ExpectColon;
                    }
                    Phase::InValue {
                        start,
                        string: true,
                    } => self.value_done(start, i + 1),
                    _ => {}
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.string.open();
                if self.depth == 1 {
                    match self.phase {
                        Phase::ExpectKey => self.phase = Phase::InKey { start: i },
                        Phase::ExpectValue => self.value_starts(i, true),
                        _ => {}
                    }
                }
            }
            b'{' | b'[' => {
                if self.depth == 1 && self.phase == Phase::ExpectValue {
                    self.value_starts(i, false);
                }
                self.depth += 1;
            }
            b'}' | b']' => {
                if self.depth == 1 {
                    if let Phase::InValue { start, .. } = self.phase {
                        self.value_done(start, i);
                    }
                }
                self.depth = self.depth.saturating_sub(1);
                match self.depth {
                    0 => self.end = Some(i + 1),
                    1 => {
                        if let Phase::InValue { start, .. } = self.phase {
                            self.value_done(start, i + 1);
                        }
                    }
                    _ => {}
                }
            }
            b':' if self.depth == 1 && self.phase == Phase::ExpectColon => {
                self.phase = Phase::ExpectValue;
            }
            b',' if self.depth == 1 => {
                if let Phase::InValue { start, .. } = self.phase {
                    self.value_done(start, i);
                }
                self.phase = Phase::ExpectKey;
            }
            b if b.is_ascii_whitespace() => {
                if self.depth == 1 {
                    if let Phase::InValue { start, .. } = self.phase {
                        self.value_done(start, i);
                    }
                }
            }
            _ => {
                if self.depth == 1 && self.phase == Phase::ExpectValue {
                    self.value_starts(i, false);
                }
            }
        }
    }

    fn value_starts(&mut self, start: usize, string: bool) {
        self.phase = Phase::InValue { start, string };
        if ARGUMENT_KEYS.contains(&self.key.as_str()) && self.arguments.is_none() {
            self.arguments = Some((start, None));
        }
    }

    fn value_done(&mut self, start: usize, end: usize) {
        self.phase = Phase::AfterValue;
        if self.key == "name" && self.name.is_none() {
            self.name = serde_json::from_str::<String>(&self.text[start..end]).ok();
        } else if ARGUMENT_KEYS.contains(&self.key.as_str()) {
            if let Some((s, None)) = self.arguments {
                if s == start {
                    self.arguments = Some((start, Some(end)));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run(pieces: &[&str]) -> (Option<String>, String, bool) {
        let mut call = CallObject::new();
        let mut name = None;
        let mut args = String::new();
        for p in pieces {
            call.feed(p);
            let got = call.take();
            if got.name.is_some() {
                assert!(name.is_none(), "name given twice");
                name = got.name;
            }
            args.push_str(&got.arguments);
        }
        (name, args, call.is_complete())
    }

    #[test]
    fn name_then_arguments() {
        let text =
            r#"{"name": "get_weather", "arguments": {"city": "Pa\"ris}", "n": [1, {"a": 2}]}}"#;
        let (name, args, done) = run(&[text]);
        assert_eq!(name.as_deref(), Some("get_weather"));
        assert_eq!(args, r#"{"city": "Pa\"ris}", "n": [1, {"a": 2}]}"#);
        assert!(done);
    }

    #[test]
    fn arguments_before_name_wait_for_it() {
        let text = r#"{"parameters": {"x": 1}, "name": "f"}"#;
        let mut call = CallObject::new();
        call.feed(&text[..20]);
        assert_eq!(call.take(), CallProgress::default());
        call.feed(&text[20..]);
        let got = call.take();
        assert_eq!(got.name.as_deref(), Some("f"));
        assert_eq!(got.arguments, r#"{"x": 1}"#);
    }

    #[test]
    fn missing_arguments_are_an_empty_object_and_trailing_text_is_left() {
        let mut call = CallObject::new();
        let used = call.feed(r#" {"name": "ping"} and more"#);
        assert_eq!(used, r#" {"name": "ping"}"#.len());
        let got = call.take();
        assert_eq!(got.arguments, "{}");
        assert!(call.is_complete());
    }

    #[test]
    fn not_an_object_is_invalid() {
        let mut call = CallObject::new();
        call.feed("  hello");
        assert!(call.is_invalid());
    }

    #[test]
    fn every_split_gives_the_same_call() {
        let text = r#"{"name": "é_f", "arguments": {"q": "naïve ü", "k": [true, null]}}"#;
        let whole = run(&[text]);
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            assert_eq!(run(&[&text[..cut], &text[cut..]]), whole, "cut at {cut}");
        }
    }
}
