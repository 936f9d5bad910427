//! Where one JSON object or array ends, found as its text streams in: nesting depth and
//! string state only, so the text is passed on as written. Structural characters are
//! ASCII, so the end is always at a character boundary.

/// The scanner of one value that starts with `{` or `[`.
#[derive(Debug, Default)]
pub struct ValueScan {
    depth: usize,
    in_string: bool,
    escape: bool,
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
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
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
