//! How a download shows its progress: a bar redrawn in place on a terminal, and on
//! anything else (container logs, a file) a log line every few seconds, so a slow pull
//! is visible either way without flooding the log.

use std::io::Write;
use std::time::{Duration, Instant};

/// Least time between two redraws of the bar.
const REDRAW: Duration = Duration::from_millis(200);
/// Time between two progress lines in the logs.
const LOG_EVERY: Duration = Duration::from_secs(5);
const BAR_WIDTH: usize = 30;

/// The progress of one file.
pub struct Progress {
    name: String,
    total: u64,
    done: u64,
    /// Bytes already on disk when this transfer started (a resumed download).
    resumed_from: u64,
    started: Instant,
    last_shown: Instant,
    bar: bool,
}

impl Progress {
    /// `done` of `total` bytes of `name` are already here; `bar` draws a bar on standard
    /// error, else progress goes to the logs.
    pub fn start(name: &str, total: u64, done: u64, bar: bool) -> Self {
        let verb = if done > 0 { "resuming" } else { "downloading" };
        tracing::info!(
            "{verb} {name} ({}){}",
            megabytes(total),
            if done > 0 {
                format!(" from {}", megabytes(done))
            } else {
                String::new()
            }
        );
        let now = Instant::now();
        Progress {
            name: name.to_string(),
            total,
            done,
            resumed_from: done,
            started: now,
            last_shown: now,
            bar,
        }
    }

    /// `bytes` more arrived.
    pub fn advance(&mut self, bytes: u64) {
        self.done += bytes;
        let since = self.last_shown.elapsed();
        if (self.bar && since >= REDRAW) || (!self.bar && since >= LOG_EVERY) {
            self.show();
        }
    }

    /// The transfer was cut after `done` bytes; it restarts there.
    pub fn interrupted(&mut self, why: &str) {
        self.end_bar();
        tracing::warn!(
            "{}: interrupted at {} of {} ({why}); resuming",
            self.name,
            megabytes(self.done),
            megabytes(self.total)
        );
    }

    /// The bytes start again from nothing (the hub did not resume).
    pub fn restart(&mut self) {
        self.done = 0;
        self.resumed_from = 0;
    }

    /// All bytes are here and checked.
    pub fn finish(mut self, algorithm: &str) {
        self.show();
        self.end_bar();
        tracing::info!(
            "downloaded {} ({}) in {:.1}s, {algorithm} checked",
            self.name,
            megabytes(self.total),
            self.started.elapsed().as_secs_f64()
        );
    }

    /// The bytes per second of this transfer (resumed bytes not counted).
    fn rate(&self) -> f64 {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        self.done.saturating_sub(self.resumed_from) as f64 / secs
    }

    fn show(&mut self) {
        self.last_shown = Instant::now();
        let fraction = if self.total == 0 {
            1.0
        } else {
            self.done as f64 / self.total as f64
        };
        if self.bar {
            let filled = ((fraction * BAR_WIDTH as f64) as usize).min(BAR_WIDTH);
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r{} [{}{}] {} / {} {}/s ",
                self.name,
                "#".repeat(filled),
                ".".repeat(BAR_WIDTH - filled),
                megabytes(self.done),
                megabytes(self.total),
                megabytes(self.rate() as u64),
            );
            let _ = err.flush();
        } else {
            tracing::info!(
                "downloading {}: {} of {} ({:.0}%), {}/s",
                self.name,
                megabytes(self.done),
                megabytes(self.total),
                fraction * 100.0,
                megabytes(self.rate() as u64)
            );
        }
    }

    /// Ends the bar's line, so the next output starts on its own.
    fn end_bar(&self) {
        if self.bar {
            let _ = writeln!(std::io::stderr());
        }
    }
}

/// `bytes` in MB (10^6, as the hub's pages show sizes), one decimal.
fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}
