//! Text scanning shared by the parsers: finding a marker that may arrive split across
//! pieces, and holding back trailing blanks of content until it is known whether a call
//! follows them.

use crate::api::tools::parsers::ToolEvent;

/// Where `marker` is in `text`.
#[derive(Debug, PartialEq, Eq)]
pub enum MarkerScan {
    /// At this byte offset.
    Found(usize),
    /// Not there; `text[..safe]` cannot be the start of it, the rest might be.
    NotYet { safe: usize },
}

/// Looks for `marker` (ASCII) in `text`.
pub fn find_marker(text: &str, marker: &str) -> MarkerScan {
    if let Some(at) = text.find(marker) {
        return MarkerScan::Found(at);
    }
    let longest = (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0);
    MarkerScan::NotYet {
        safe: text.len() - longest,
    }
}

/// Takes `pending` up to `marker`, removing both; `None` while the marker has not come.
pub fn take_until(pending: &mut String, marker: &str) -> Option<String> {
    let at = pending.find(marker)?;
    let text: String = pending.drain(..at).collect();
    pending.drain(..marker.len());
    Some(text)
}

/// Skips blanks, then takes the first of `tags` that `pending` starts with, appending the
/// blanks and the tag to `taken`: `Some(Some(i))` for `tags[i]`; `Some(None)` if `pending`
/// can start with none of them; `None` while undecided.
pub fn take_tag(pending: &mut String, tags: &[&str], taken: &mut String) -> Option<Option<usize>> {
    let trimmed = pending.trim_start();
    if let Some(i) = tags.iter().position(|t| trimmed.starts_with(t)) {
        let skip = pending.len() - trimmed.len() + tags[i].len();
        taken.extend(pending.drain(..skip));
        return Some(Some(i));
    }
    if trimmed.is_empty() || tags.iter().any(|t| t.starts_with(trimmed)) {
        return None;
    }
    Some(None)
}

/// Sends the content of `pending` up to `open`, taking the marker too: `true` once it is
/// found; `false` while it is not there (the text that cannot start it is sent).
pub fn content_until(
    pending: &mut String,
    open: &str,
    content: &mut ContentOut,
    out: &mut Vec<ToolEvent>,
) -> bool {
    match find_marker(pending, open) {
        MarkerScan::Found(at) => {
            let before: String = pending.drain(..at + open.len()).collect();
            content.push(&before[..at], out);
            true
        }
        MarkerScan::NotYet { safe } => {
            let text: String = pending.drain(..safe).collect();
            content.push(&text, out);
            false
        }
    }
}

/// Content as it goes out: trailing blanks wait until more text shows they are inside
/// the reply; blanks before a call, or left at the end of a reply with calls, are
/// dropped.
#[derive(Debug, Default)]
pub struct ContentOut {
    held: String,
    pub calls: usize,
}

impl ContentOut {
    /// Content text.
    pub fn push(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        if text.is_empty() {
            return;
        }
        let body = text.trim_end();
        if body.is_empty() {
            self.held.push_str(text);
            return;
        }
        let mut emit = std::mem::take(&mut self.held);
        emit.push_str(body);
        self.held.push_str(&text[body.len()..]);
        out.push(ToolEvent::Content(emit));
    }

    /// A call begins: blanks held before it are dropped; gives its index.
    pub fn call(&mut self) -> usize {
        self.held.clear();
        self.calls += 1;
        self.calls - 1
    }

    /// The reply ended.
    pub fn finish(&mut self, out: &mut Vec<ToolEvent>) {
        let held = std::mem::take(&mut self.held);
        if self.calls == 0 && !held.is_empty() {
            out.push(ToolEvent::Content(held));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_markers_are_held() {
        assert_eq!(
            find_marker("ab<tool", "<tool_call>"),
            MarkerScan::NotYet { safe: 2 }
        );
        assert_eq!(
            find_marker("ab<", "<tool_call>"),
            MarkerScan::NotYet { safe: 2 }
        );
        assert_eq!(
            find_marker("abc", "<tool_call>"),
            MarkerScan::NotYet { safe: 3 }
        );
        assert_eq!(
            find_marker("a<tool_call>b", "<tool_call>"),
            MarkerScan::Found(1)
        );
    }
}
