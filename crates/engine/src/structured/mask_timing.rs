//! How long grammar masks take, over every constrained sequence of a model: a histogram
//! of the time per mask (one mask per constrained token), read by the server as
//! `tessera_structured_output_mask_seconds`.

use tessera_protocol::DurationHistogram;

/// Upper bounds of the buckets, in seconds: a mask over a 50k vocabulary takes tens of
/// microseconds when the lexer state is simple and milliseconds inside a long string.
pub const MASK_BUCKETS_SECONDS: [f64; 12] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 1e-1,
];

/// An empty histogram of mask times.
pub(crate) fn mask_histogram() -> DurationHistogram {
    DurationHistogram::new(&MASK_BUCKETS_SECONDS)
}
