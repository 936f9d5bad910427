//! Server-sent events read from bytes as they arrive: lines split on `\n` (a `\r`
//! before it dropped), `event:` and `data:` fields gathered, an event given out at each
//! blank line, as the HTML standard's event-stream parser does.

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if the event had one.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes of a line not yet ended (a chunk may end inside a line, or a character).
    pending: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
}

impl SseDecoder {
    /// The events `bytes` complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.pending.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    events.push(SseEvent {
                        event: self.event.take(),
                        data,
                    });
                }
                self.event = None;
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_str(), ""),
            };
            match field {
                "event" => self.event = Some(value.to_string()),
                "data" => {
                    let data = self.data.get_or_insert_with(String::new);
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(value);
                }
                // Comments (`: keep-alive`), `id` and `retry` carry nothing for us.
                _ => {}
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_and_lines() {
        let mut d = SseDecoder::default();
        assert!(d.push(b"event: a\r\ndata: {\"x\"").is_empty());
        let got = d.push(b": 1}\r\n\r\n: comment\n\ndata: [DONE]\n\n");
        assert_eq!(
            got,
            [
                SseEvent {
                    event: Some("a".into()),
                    data: "{\"x\": 1}".into()
                },
                SseEvent {
                    event: None,
                    data: "[DONE]".into()
                }
            ]
        );
        // A character cut in two by the chunks survives.
        let mut d = SseDecoder::default();
        let bytes = "data: é\n\n".as_bytes();
        assert!(d.push(&bytes[..7]).is_empty());
        assert_eq!(d.push(&bytes[7..])[0].data, "é");
    }
}
