//! `StopMatcher`: finds stop strings in streamed text and decides what is safe to show.
//!
//! Text arrives in deltas whose boundaries have nothing to do with the stop strings, so a
//! stop string may span several deltas. The matcher keeps a small pending buffer:
//!
//! * if the buffer contains a stop string, everything before its earliest occurrence is
//!   released, the stop string and everything after it are dropped, and the matcher is
//!   finished;
//! * otherwise the longest suffix of the buffer that is a proper prefix of some stop
//!   string is held back (it may yet become a stop string) and the rest is released.
//!
//! Invariant: any future occurrence of a stop string starts inside the held-back suffix,
//! so released text never has to be taken back.

/// Result of feeding one delta.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutcome {
    /// Text that can be sent to the client now.
    pub text: String,
    /// Index (into the stop strings given to [`StopMatcher::new`]) of the stop string that
    /// ended generation, if one did.
    pub stopped_by: Option<usize>,
}

/// Stop-string matcher for one sequence.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
    /// Release the stop string that matched too (vLLM's `include_stop_str_in_output`).
    include_stop: bool,
}

impl StopMatcher {
    /// A matcher for `stops`. Empty strings are ignored (they would match everywhere).
    pub fn new<I, S>(stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        StopMatcher {
            stops: stops.into_iter().map(Into::into).collect(),
            pending: String::new(),
            stopped: false,
            include_stop: false,
        }
    }

    /// Whether the stop string that ends the text is released with it.
    pub fn including_stop(mut self, include: bool) -> Self {
        self.include_stop = include;
        self
    }

    /// Whether a stop string has been matched; later deltas are ignored.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds a text delta.
    pub fn push(&mut self, delta: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::default();
        }
        self.pending.push_str(delta);
        if let Some((position, index)) = self.earliest_stop() {
            self.stopped = true;
            let mut text = std::mem::take(&mut self.pending);
            let end = match self.include_stop {
                true => position + self.stops[index].len(),
                false => position,
            };
            text.truncate(end);
            return StopOutcome {
                text,
                stopped_by: Some(index),
            };
        }
        StopOutcome {
            text: self.release(),
            stopped_by: None,
        }
    }

    /// Feeds a delta in which no stop string may end the text (before vLLM's
    /// `min_tokens`): the text is released, except a suffix that may begin a stop string
    /// completed by a later delta.
    pub fn push_unchecked(&mut self, delta: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.pending.push_str(delta);
        self.release()
    }

    /// Takes the pending text but its held-back suffix.
    fn release(&mut self) -> String {
        let hold = self.held_back_len();
        let release_len = self.pending.len() - hold;
        let held = self.pending.split_off(release_len);
        std::mem::replace(&mut self.pending, held)
    }

    /// Generation ended for another reason: releases the held-back text.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.pending)
    }

    /// Byte position of the earliest stop-string occurrence in the buffer and the index of
    /// that stop string; among stops starting at the same place, the first given wins.
    fn earliest_stop(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter(|(_, stop)| !stop.is_empty())
            .filter_map(|(index, stop)| self.pending.find(stop.as_str()).map(|pos| (pos, index)))
            .min()
    }

    /// Length in bytes of the longest buffer suffix that is a proper prefix of a stop
    /// string. Suffixes start at character boundaries only.
    fn held_back_len(&self) -> usize {
        let mut longest = 0;
        for stop in self.stops.iter().filter(|s| !s.is_empty()) {
            let max_len = self.pending.len().min(stop.len() - 1);
            for (start, _) in self.pending.char_indices().rev() {
                let len = self.pending.len() - start;
                if len > max_len {
                    break;
                }
                if len > longest && stop.starts_with(&self.pending[start..]) {
                    longest = len;
                }
            }
        }
        longest
    }
}
