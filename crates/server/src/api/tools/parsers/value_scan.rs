//! Where one JSON object or array ends, found as its text streams in: nesting depth and
//! string state only, so the text is passed on as written. Structural characters are
//! ASCII, so the end is always at a character boundary.

/// Whether JSON text read byte by byte is inside a string (escapes included).
#[derive(Debug, Default, Clone, Copy)]
pub struct StringState {
    inside: bool,
    escape: bool,
}

impl StringState {
    /// Reads `b` if a string is open: `Some(true)` when `b` closed it, `Some(false)` when
    /// `b` was inside it. `None` when no string is open: the byte is the caller's, and a
    /// `"` there is for [`StringState::open`].
    pub fn read(&mut self, b: u8) -> Option<bool> {
        if !self.inside {
            return None;
        }
        if self.escape {
            self.escape = false;
        } else if b == b'\\' {
            self.escape = true;
        } else if b == b'"' {
            self.inside = false;
            return Some(true);
        }
        Some(false)
    }

    /// A string starts (its opening quote was read outside one).
    pub fn open(&mut self) {
        self.inside = true;
    }
}

/// The scanner of one value that starts with `{` or `[`.
#[derive(Debug, Default)]
pub struct ValueScan {
    depth: usize,
    string: StringState,
    done: bool,
}

impl ValueScan {
    /// Reads `text`; returns how many of its bytes belong to the value (all of them until
    /// the closing bracket).
    pub fn feed(&mut self, text: &str) -> usize {
        if self.done {
            return 0;
        }
        for (i, b) in text.bytes().enumerate() {
            if self.string.read(b).is_some() {
                continue;
            }
            match b {
                b'"' => self.string.open(),
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        self.done = true;
                        return i + 1;
                    }
                }
                _ => {}
            }
        }
        text.len()
    }

    /// The closing bracket was read.
    pub fn is_done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_inside_strings_do_not_end_the_value() {
        let text = r#"{"a": "}]\"}", "b": [1, {"c": []}]} tail"#;
        let end = text.find(" tail").unwrap_or_default();
        for cut in 0..=text.len() {
            let mut scan = ValueScan::default();
            let first = scan.feed(&text[..cut]);
            let used = if scan.is_done() {
                first
            } else {
                first + scan.feed(&text[cut..])
            };
            assert_eq!(used, end, "cut at {cut}");
            assert!(scan.is_done());
        }
    }
}
