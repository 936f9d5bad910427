//! What `tessera chat` keeps between turns: the system message and the turns so far,
//! and what a typed line means.

use serde_json::{json, Value};

/// A line typed at the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Empty,
    Message(String),
    /// `/reset`: forget the turns (the system message stays).
    Reset,
    /// `/system TEXT`: the system message from now on (empty: none).
    System(String),
    /// `/exit` (or `/quit`).
    Exit,
    /// `/help`, or a command that is none of these.
    Help(Option<String>),
}

impl Input {
    pub fn parse(line: &str) -> Self {
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            return Input::Empty;
        }
        let Some(command) = line.trim_start().strip_prefix('/') else {
            return Input::Message(line.to_string());
        };
        let (name, rest) = command.split_once(' ').unwrap_or((command, ""));
        match name {
            "reset" | "clear" => Input::Reset,
            "system" => Input::System(rest.trim().to_string()),
            "exit" | "quit" | "bye" => Input::Exit,
            "help" | "?" => Input::Help(None),
            other => Input::Help(Some(format!("/{other}"))),
        }
    }
}

/// The commands, as the banner and `/help` list them.
pub const COMMANDS: &str = "/system TEXT sets the system message, /reset starts over, /exit leaves";

#[derive(Debug, Default)]
pub struct Conversation {
    system: Option<String>,
    /// `(role, text)` of the turns so far.
    turns: Vec<(&'static str, String)>,
}

impl Conversation {
    pub fn new(system: Option<String>) -> Self {
        Conversation {
            system: system.filter(|s| !s.is_empty()),
            turns: Vec::new(),
        }
    }

    pub fn reset(&mut self) {
        self.turns.clear();
    }

    pub fn set_system(&mut self, text: String) {
        self.system = (!text.is_empty()).then_some(text);
    }

    pub fn push_user(&mut self, text: String) {
        self.turns.push(("user", text));
    }

    pub fn push_assistant(&mut self, text: String) {
        self.turns.push(("assistant", text));
    }

    /// Takes back the last user turn (its answer failed).
    pub fn pop_user(&mut self) {
        if self.turns.last().is_some_and(|(role, _)| *role == "user") {
            self.turns.pop();
        }
    }

    /// The `messages` of the next request.
    pub fn messages(&self) -> Vec<Value> {
        self.system
            .iter()
            .map(|s| json!({"role": "system", "content": s}))
            .chain(
                self.turns
                    .iter()
                    .map(|(role, text)| json!({"role": role, "content": text})),
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_commands() {
        assert_eq!(Input::parse("  \n"), Input::Empty);
        assert_eq!(
            Input::parse("hi /there\n"),
            Input::Message("hi /there".into())
        );
        assert_eq!(Input::parse("/reset"), Input::Reset);
        assert_eq!(
            Input::parse("/system Be brief. "),
            Input::System("Be brief.".into())
        );
        assert_eq!(Input::parse("/exit\r\n"), Input::Exit);
        assert_eq!(Input::parse("/nope x"), Input::Help(Some("/nope".into())));
    }

    #[test]
    fn the_system_message_outlives_a_reset() {
        let mut c = Conversation::new(Some("S".into()));
        c.push_user("a".into());
        c.push_assistant("b".into());
        c.push_user("c".into());
        c.pop_user();
        assert_eq!(c.messages().len(), 3);
        c.reset();
        assert_eq!(c.messages(), [json!({"role": "system", "content": "S"})]);
        c.set_system(String::new());
        assert!(c.messages().is_empty());
    }
}
