//! A call's arguments as Qwen3-Coder and MiniMax-M2 write them: one tag per argument,
//! `<open>KEY>VALUE</close>`, until the call's end tag, each value bare text typed by the
//! tools' schemas ([`ParamTypes`]). Each argument is sent once its value is closed.

use crate::api::tools::parsers::markers::{take_tag, take_until};
use crate::api::tools::parsers::param_types::{close_call, ParamTypes};
use crate::api::tools::parsers::ToolEvent;

/// A family's argument tags and how it writes keys and values.
#[derive(Debug)]
pub struct ArgTags {
    /// Opens an argument, up to its key (`<parameter=`).
    pub open: &'static str,
    /// Closes an argument's value (`</parameter>`).
    pub close: &'static str,
    /// Ends the call (`</function>`).
    pub end: &'static str,
    /// The key as written to its name.
    pub key: fn(&str) -> String,
    /// The value as written to its text.
    pub value: fn(&str) -> &str,
}

/// How a call's arguments ended.
#[derive(Debug, PartialEq, Eq)]
pub enum ArgsEnd {
    /// At the call's end tag.
    Closed,
    /// At text that is neither an argument nor the end: the call ends there.
    Broken,
}

/// The arguments of call `index` of function `name`, as they are read.
#[derive(Debug)]
pub struct TaggedArgs {
    index: usize,
    name: String,
    sent: usize,
    /// Inside an argument's tag: its key, once read.
    open: Option<Option<String>>,
}

impl TaggedArgs {
    pub fn new(index: usize, name: String) -> Self {
        TaggedArgs {
            index,
            name,
            sent: 0,
            open: None,
        }
    }

    /// Reads arguments from `pending`: `None` while more text is needed, else how the
    /// call ended (its arguments closed).
    pub fn run(
        &mut self,
        pending: &mut String,
        tags: &ArgTags,
        types: &ParamTypes,
        out: &mut Vec<ToolEvent>,
    ) -> Option<ArgsEnd> {
        loop {
            match &mut self.open {
                None => match take_tag(pending, &[tags.open, tags.end], &mut String::new())? {
                    Some(0) => self.open = Some(None),
                    found => {
                        out.push(close_call(self.index, self.sent));
                        return Some(match found {
                            Some(_) => ArgsEnd::Closed,
                            None => ArgsEnd::Broken,
                        });
                    }
                },
                Some(key @ None) => *key = Some((tags.key)(&take_until(pending, ">")?)),
                Some(Some(key)) => {
                    let raw = take_until(pending, tags.close)?;
                    out.push(ToolEvent::CallArguments {
                        index: self.index,
                        fragment: types.fragment(&self.name, key, (tags.value)(&raw), self.sent),
                    });
                    self.sent += 1;
                    self.open = None;
                }
            }
        }
    }

    /// The text ended inside the call: its complete arguments stand.
    pub fn finish(&self, out: &mut Vec<ToolEvent>) {
        out.push(close_call(self.index, self.sent));
    }
}
