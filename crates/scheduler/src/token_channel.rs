//! A request's event channel: bounded, with backpressure into the scheduler.
//!
//! Tokens for a client that does not read must not pile up without bound until the
//! server's stall timeout. The channel holds at most `capacity` events; before a step
//! the scheduler asks [`TokenSender::has_room_for_token`], and a sequence whose client
//! has not made room gets no step: it stays running (its KV blocks kept) but stalled.
//!
//! Invariant: a token is only sent when the channel has room for it *and* one more
//! event, and only the engine loop sends, so the one terminal event (`Finished`,
//! `Failed`, `Error`) always fits.
//!
//! Waking: with every runnable sequence stalled the engine loop blocks on its commands.
//! A receiver that makes room in a stalled channel, or is dropped (the client left),
//! wakes it. The flag and the capacity are checked in opposite orders on the two sides
//! with a fence in between, so either the scheduler sees the room or the receiver sees
//! the flag: no wake-up is lost.

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tessera_protocol::TokenEvent;
use tokio::sync::mpsc;
pub use tokio::sync::mpsc::error::TryRecvError;

/// Wakes the engine loop (sends it a no-op command).
pub(crate) type Wake = Arc<dyn Fn() + Send + Sync>;

struct Shared {
    /// The scheduler skipped this sequence for want of room.
    stalled: AtomicBool,
    wake: Option<Wake>,
    /// Prompt tokens the prefix cache held when the sequence was first admitted; set
    /// before its first token is sent, so a receiver that has a token sees it.
    cached_prompt_tokens: AtomicUsize,
}

impl Shared {
    fn room_made(&self) {
        fence(Ordering::SeqCst);
        if self.stalled.swap(false, Ordering::SeqCst) {
            if let Some(wake) = &self.wake {
                wake();
            }
        }
    }
}

/// The engine loop's end of a request's channel.
pub struct TokenSender {
    tx: mpsc::Sender<TokenEvent>,
    shared: Arc<Shared>,
}

/// The client's end: `Token`s, then exactly one `Finished`, `Failed` or `Error`.
/// Dropping it cancels the request.
pub struct TokenReceiver {
    rx: mpsc::Receiver<TokenEvent>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TokenSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSender")
            .field("capacity", &self.tx.capacity())
            .finish()
    }
}

impl std::fmt::Debug for TokenReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReceiver").finish_non_exhaustive()
    }
}

/// A channel of `capacity` events (at least 2: a token and the terminal event).
pub(crate) fn token_channel(capacity: usize, wake: Option<Wake>) -> (TokenSender, TokenReceiver) {
    let (tx, rx) = mpsc::channel(capacity.max(2));
    let shared = Arc::new(Shared {
        stalled: AtomicBool::new(false),
        wake,
        cached_prompt_tokens: AtomicUsize::new(0),
    });
    (
        TokenSender {
            tx,
            shared: Arc::clone(&shared),
        },
        TokenReceiver { rx, shared },
    )
}

impl TokenSender {
    /// Whether the channel takes a token and still has room for the terminal event.
    /// When it does not, the sequence is marked stalled and its receiver will wake the
    /// loop once it makes room.
    pub fn has_room_for_token(&self) -> bool {
        if self.tx.capacity() >= 2 {
            return true;
        }
        self.shared.stalled.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.tx.capacity() >= 2 {
            // The client read meanwhile; it may or may not have seen the flag.
            self.shared.stalled.store(false, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// Tokens that fit the channel now besides the final event.
    pub fn token_room(&self) -> usize {
        self.tx.capacity().saturating_sub(1)
    }

    /// Send an event; false when the receiver is gone (or, against the invariant, the
    /// channel is full: the event is dropped and the sequence must end).
    pub fn send(&self, event: TokenEvent) -> bool {
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::error!("a request's event channel is full; ending the request");
                false
            }
        }
    }

    /// The client dropped its receiver.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Records how much of the prompt the prefix cache held (before any token is sent).
    pub fn set_cached_prompt_tokens(&self, tokens: usize) {
        self.shared
            .cached_prompt_tokens
            .store(tokens, Ordering::Release);
    }
}

impl TokenReceiver {
    /// Prompt tokens the prefix cache held when the sequence was admitted: known once
    /// any event has been received.
    pub fn cached_prompt_tokens(&self) -> usize {
        self.shared.cached_prompt_tokens.load(Ordering::Acquire)
    }

    /// The next event; `None` once the sequence has ended and everything was read.
    pub async fn recv(&mut self) -> Option<TokenEvent> {
        let event = self.rx.recv().await;
        self.shared.room_made();
        event
    }

    /// The next event if one is buffered.
    pub fn try_recv(&mut self) -> Result<TokenEvent, TryRecvError> {
        let event = self.rx.try_recv();
        if event.is_ok() {
            self.shared.room_made();
        }
        event
    }

    /// As `recv`, blocking the thread (not for async contexts).
    pub fn blocking_recv(&mut self) -> Option<TokenEvent> {
        let event = self.rx.blocking_recv();
        self.shared.room_made();
        event
    }
}

impl Drop for TokenReceiver {
    fn drop(&mut self) {
        // Close first, so the woken loop sees the request cancelled.
        self.rx.close();
        self.shared.room_made();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn token(t: u32) -> TokenEvent {
        TokenEvent::Token {
            token: t,
            logprobs: None,
            prompt_logprobs: None,
        }
    }

    #[test]
    fn a_full_channel_stalls_and_reading_wakes_once() {
        let wakes = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&wakes);
        let wake: Wake = Arc::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let (tx, mut rx) = token_channel(3, Some(wake));
        assert!(tx.has_room_for_token());
        assert!(tx.send(token(1)));
        assert!(tx.has_room_for_token());
        assert!(tx.send(token(2)));
        // One slot left: kept for the terminal event.
        assert!(!tx.has_room_for_token());
        assert_eq!(wakes.load(Ordering::SeqCst), 0);
        assert_eq!(rx.try_recv().ok(), Some(token(1)));
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        assert_eq!(rx.try_recv().ok(), Some(token(2)));
        assert_eq!(wakes.load(Ordering::SeqCst), 1, "woken once per stall");
        assert!(tx.has_room_for_token());
        assert!(tx.send(TokenEvent::Error("x".into())));
        drop(rx);
        assert!(tx.is_closed());
    }

    #[test]
    fn dropping_a_stalled_receiver_wakes_the_loop() {
        let wakes = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&wakes);
        let wake: Wake = Arc::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let (tx, rx) = token_channel(2, Some(wake));
        assert!(tx.send(token(1)));
        assert!(!tx.has_room_for_token());
        drop(rx);
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        assert!(tx.is_closed());
    }
}
