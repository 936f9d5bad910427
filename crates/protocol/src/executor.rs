//! The boundary between the scheduler and whatever runs the model.

/// A block-table entry whose block went back to the pool because the attention window
/// of its group's layers has moved past it. Executors never read it.
pub const RELEASED_BLOCK: u32 = u32::MAX;

/// Shape of the paged KV cache an executor owns; the scheduler hands out its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheShape {
    pub num_blocks: usize,
    pub block_size_tokens: usize,
    /// Set when every layer attends to a sliding window of this many positions: a token
    /// at position `p` reads only positions `p + 1 - window ..= p`. Blocks wholly before
    /// the window of a sequence's next position are never read again, so the scheduler
    /// releases them ([`RELEASED_BLOCK`]). `None` when some layer reads the whole context.
    /// With [`KvCacheShape::hybrid`] groups, the window of the sliding groups only.
    pub attention_window: Option<usize>,
    /// Layers grouped by attention kind (vLLM's hybrid KV cache manager): each group has
    /// its own block table per sequence, so sliding groups release their blocks behind
    /// the window while full groups keep the whole context. `None`: one group, every
    /// layer in it (today's layout, the cheapest when no layer slides or all do).
    pub hybrid: Option<KvGroups>,
}

/// How a hybrid cache groups its layers: `full` groups of full-attention layers (group
/// ids `0..full`), then `sliding` groups whose layers attend to
/// [`KvCacheShape::attention_window`]. A block id names the same layer slots in every
/// group, so all groups draw from the one pool and a block holds one group's worth of
/// layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGroups {
    pub full: usize,
    pub sliding: usize,
}

impl KvCacheShape {
    /// A cache whose every block stays readable for the whole context.
    pub fn new(num_blocks: usize, block_size_tokens: usize) -> Self {
        Self {
            num_blocks,
            block_size_tokens,
            attention_window: None,
            hybrid: None,
        }
    }

    /// Groups of layers with their own block tables (at least 1).
    pub fn num_groups(&self) -> usize {
        self.hybrid.map_or(1, |h| (h.full + h.sliding).max(1))
    }

    /// The window group `group`'s layers attend to; `None`: the whole context. Group 0
    /// is a full group whenever any layer reads the whole context.
    pub fn group_window(&self, group: usize) -> Option<usize> {
        match self.hybrid {
            Some(h) if group < h.full => None,
            _ => self.attention_window,
        }
    }

    /// [`KvCacheShape::first_live_block`] for group `group`.
    pub fn group_first_live_block(&self, group: usize, start_pos: usize) -> usize {
        self.group_window(group).map_or(0, |w| {
            (start_pos + 1).saturating_sub(w) / self.block_size_tokens.max(1)
        })
    }

    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * self.block_size_tokens
    }

    /// Index of the first block that a chunk starting at `start_pos` (or any later one)
    /// reads; the blocks before it may be released.
    pub fn first_live_block(&self, start_pos: usize) -> usize {
        self.group_first_live_block(0, start_pos)
    }

    /// Longest context one sequence can reach in this cache when each of its chunks has
    /// at most `max_chunk_tokens` tokens. With a window, a sequence holds at most the
    /// blocks of its window plus one chunk at any time; when those fit, any length does
    /// (`usize::MAX`). Otherwise every position needs its block: the whole capacity.
    /// Hybrid groups: each full group holds every block of the context, each sliding
    /// group at most that span, all from the one pool.
    pub fn max_sequence_tokens(&self, max_chunk_tokens: usize) -> usize {
        let bs = self.block_size_tokens.max(1);
        if let (Some(h), Some(w)) = (self.hybrid, self.attention_window) {
            let span = (w + max_chunk_tokens + bs).saturating_sub(2).div_ceil(bs);
            let (full, all) = (h.full.max(1), (h.full + h.sliding).max(1));
            let per_full = match all.saturating_mul(span) <= self.num_blocks {
                true => (self.num_blocks - h.sliding * span) / full,
                false => self.num_blocks / all,
            };
            return per_full.saturating_mul(bs);
        }
        match self.attention_window {
            // A chunk at `c` holds blocks from `(c + 1 - w) / bs` up to `(c + n) / bs`
            // rounded up: at most `(w + n + bs - 2) / bs` of them, rounded up.
            Some(w)
                if (w + max_chunk_tokens + bs).saturating_sub(2).div_ceil(bs)
                    <= self.num_blocks =>
            {
                usize::MAX
            }
            _ => self.capacity_tokens(),
        }
    }
}

/// How far a failed step reaches. Failures stay as small as their cause: a sequence the
/// executor cannot run is reported in [`crate::StepOutput::failed`] while the rest of
/// the step goes on; an error that spoils the step fails the sequences of that step;
/// only a lost device or a failed collective ends the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureScope {
    /// The step's sequences failed; the executor is consistent again and runs the next
    /// step (sequences not in the step, queued or running, are untouched).
    Step,
    /// A device failed, a collective failed or timed out, or a rank hung: the executor
    /// runs no more steps and every request fails.
    Group,
}

/// Why a step failed. `rank` names the device worker that failed first, when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", rank.map(|r| format!("rank {r}: ")).unwrap_or_default())]
pub struct ExecutorError {
    pub rank: Option<usize>,
    pub message: String,
    pub scope: FailureScope,
}

impl ExecutorError {
    /// A failure of this step only.
    pub fn step(rank: Option<usize>, message: impl Into<String>) -> Self {
        Self {
            rank,
            message: message.into(),
            scope: FailureScope::Step,
        }
    }

    /// A failure that ends the executor.
    pub fn group(rank: Option<usize>, message: impl Into<String>) -> Self {
        Self {
            rank,
            message: message.into(),
            scope: FailureScope::Group,
        }
    }
}

/// Runs planned steps. The engine implements it for real models; tests use fakes.
pub trait Executor: Send {
    /// Run one step. Blocks until every device has finished it. A sequence the executor
    /// refuses (its own input is at fault) goes into `StepOutput::failed`; an error says
    /// with its [`FailureScope`] whether the executor can go on.
    fn step(&mut self, plan: &crate::StepPlan) -> Result<crate::StepOutput, ExecutorError>;

    /// The KV cache this executor owns.
    fn kv_cache_shape(&self) -> KvCacheShape;

    /// Longest context the model supports, in tokens.
    fn max_context_tokens(&self) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windowed(num_blocks: usize, block_size: usize, window: usize) -> KvCacheShape {
        KvCacheShape {
            attention_window: Some(window),
            ..KvCacheShape::new(num_blocks, block_size)
        }
    }

    #[test]
    fn first_live_block_holds_the_window_of_the_next_position() {
        let shape = windowed(100, 4, 8);
        // Position 10 reads 3..=10: block 0 (positions 0..4) is still live.
        assert_eq!(shape.first_live_block(10), 0);
        // Position 11 reads 4..=11: block 0 is behind the window.
        assert_eq!(shape.first_live_block(11), 1);
        assert_eq!(shape.first_live_block(15), 2);
        assert_eq!(KvCacheShape::new(100, 4).first_live_block(1000), 0);
    }

    #[test]
    fn the_span_bound_covers_every_start_and_chunk() {
        for (bs, w, n) in [
            (4, 8, 1),
            (4, 8, 16),
            (16, 4096, 2048),
            (3, 7, 5),
            (16, 5, 1),
        ] {
            let shape = windowed(usize::MAX / 2, bs, w);
            let bound = (w + n + bs - 2).div_ceil(bs);
            let worst = (0..10 * (w + bs))
                .flat_map(|c| (1..=n).map(move |k| (c, k)))
                .map(|(c, k)| (c + k).div_ceil(bs) - shape.first_live_block(c))
                .max();
            assert_eq!(worst, Some(bound), "bs {bs} window {w} chunk {n}");
            assert_eq!(windowed(bound, bs, w).max_sequence_tokens(n), usize::MAX);
            assert_eq!(
                windowed(bound - 1, bs, w).max_sequence_tokens(n),
                (bound - 1) * bs
            );
        }
        assert_eq!(KvCacheShape::new(10, 4).max_sequence_tokens(1), 40);
    }

    #[test]
    fn hybrid_groups_keep_the_full_context_in_full_groups_only() {
        // Gemma-3-270M's grouping: one full group and five sliding ones, window 8.
        let shape = KvCacheShape {
            hybrid: Some(KvGroups {
                full: 1,
                sliding: 5,
            }),
            ..windowed(100, 4, 8)
        };
        assert_eq!(shape.num_groups(), 6);
        assert_eq!(shape.group_window(0), None);
        assert_eq!(shape.group_window(5), Some(8));
        assert_eq!(shape.group_first_live_block(0, 100), 0);
        assert_eq!(shape.group_first_live_block(3, 11), 1);
        // A chunk of 4: each sliding group holds at most (8 + 4 + 2) / 4 = 4 blocks,
        // 20 in all; the full group the other 80: 320 tokens.
        assert_eq!(shape.max_sequence_tokens(4), 320);
        // Too few blocks for every span: all groups grow alike.
        let small = KvCacheShape {
            num_blocks: 12,
            ..shape
        };
        assert_eq!(small.max_sequence_tokens(4), 8);
        assert_eq!(KvCacheShape::new(10, 4).num_groups(), 1);
    }
}
