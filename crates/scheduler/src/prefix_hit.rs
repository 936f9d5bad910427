//! Prefix-cache hits over the KV groups of a cache (vLLM's hybrid rule).
//!
//! A hit of `h` blocks lets a sequence start computing at position `h * block_size`. A
//! full-attention group then needs its blocks `0..h` cached; a sliding-window group only
//! the blocks that the window of position `h * block_size` reads. The hit is the longest
//! `h` that every group satisfies. Each group chains its hashes from its own root
//! ([`BlockHash::group_root`]), so one block never stands for two groups' layers.
//!
//! With one group the rule is today's: the longest run of cached blocks from block 0.

use tessera_protocol::{KvCacheShape, RELEASED_BLOCK};

use crate::block_pool::{BlockHash, BlockId, BlockPool};

/// Full blocks found in the prefix cache for a token sequence, per KV group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// Per group, its entries for blocks `0..num_blocks`: the cached block, or
    /// [`RELEASED_BLOCK`] where a sliding group does not need it (behind its window).
    pub(crate) groups: Vec<GroupHit>,
    pub(crate) num_blocks: usize,
    pub(crate) block_size: usize,
    /// The parent of the first block: the request's cache salt, if any.
    pub(crate) root: Option<BlockHash>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GroupHit {
    pub(crate) blocks: Vec<BlockId>,
    pub(crate) hashes: Vec<BlockHash>,
}

impl PrefixHit {
    /// Tokens whose KV is already computed.
    pub fn num_tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Group 0's blocks (the only group unless the cache is hybrid).
    pub fn blocks(&self) -> &[BlockId] {
        self.groups
            .first()
            .map_or(&[], |g| &g.blocks[..self.num_blocks])
    }

    /// Group `group`'s entries: a block, or [`RELEASED_BLOCK`] where none is needed.
    pub fn group_blocks(&self, group: usize) -> &[BlockId] {
        self.groups
            .get(group)
            .map_or(&[], |g| &g.blocks[..self.num_blocks])
    }

    /// How many blocks of the hit are still cached as they were found: every block
    /// when all are (a hybrid hit is all or nothing, as its sliding groups hold only the
    /// window of its end), else, with one group, the prefix that still is.
    pub(crate) fn valid_blocks(&self, pool: &BlockPool) -> usize {
        let still = |g: &GroupHit| {
            g.blocks
                .iter()
                .zip(&g.hashes)
                .take(self.num_blocks)
                .take_while(|(b, h)| **b == RELEASED_BLOCK || pool.cached_hash(**b) == Some(**h))
                .count()
        };
        match self.groups.as_slice() {
            [] => 0,
            [one] => still(one).min(self.num_blocks),
            many => match many.iter().all(|g| still(g) >= self.num_blocks) {
                true => self.num_blocks,
                false => 0,
            },
        }
    }
}

/// Chain hashes of group `group`'s blocks of `tokens` (at most `max_blocks`), and the
/// cached block of each, stopping after the first miss when `stop_at_miss`.
fn lookups(
    pool: &BlockPool,
    tokens: &[u32],
    bs: usize,
    root: Option<BlockHash>,
    max_blocks: usize,
    stop_at_miss: bool,
) -> (Vec<BlockHash>, Vec<Option<BlockId>>) {
    let (mut hashes, mut found) = (Vec::new(), Vec::new());
    let mut parent = root;
    for chunk in tokens.chunks_exact(bs).take(max_blocks) {
        let hash = BlockHash::chain(parent, chunk);
        let id = pool.lookup(hash, parent, chunk);
        hashes.push(hash);
        found.push(id);
        if id.is_none() && stop_at_miss {
            break;
        }
        parent = Some(hash);
    }
    (hashes, found)
}

/// The longest prefix of `tokens` (in full blocks, at most `max_blocks`) cached in every
/// group of `shape`, under the salt `root`.
pub(crate) fn find(
    pool: &BlockPool,
    shape: &KvCacheShape,
    tokens: &[u32],
    root: Option<BlockHash>,
    max_blocks: usize,
) -> PrefixHit {
    let bs = shape.block_size_tokens;
    let groups = shape.num_groups();
    let mut hit = PrefixHit {
        block_size: bs,
        root,
        ..PrefixHit::default()
    };
    // Full groups first: a run from block 0 bounds every group's hit.
    let mut h = max_blocks;
    let mut found: Vec<(Vec<BlockHash>, Vec<Option<BlockId>>)> = Vec::with_capacity(groups);
    for g in 0..groups {
        let full = shape.group_window(g).is_none() || groups == 1;
        let limit = if full { max_blocks } else { 0 };
        let (hashes, ids) = lookups(
            pool,
            tokens,
            bs,
            BlockHash::group_root(root, g),
            limit,
            true,
        );
        if full {
            h = h.min(ids.iter().take_while(|b| b.is_some()).count());
        }
        found.push((hashes, ids));
    }
    // Sliding groups: hashes up to the full groups' hit, every block looked up.
    for (g, f) in found.iter_mut().enumerate() {
        if groups > 1 && shape.group_window(g).is_some() {
            *f = lookups(pool, tokens, bs, BlockHash::group_root(root, g), h, false);
        }
    }
    // Shrink `h` until every sliding group has the window of `h * bs` cached: each
    // group's answer is at most what it was asked, so this ends.
    loop {
        let before = h;
        for (g, (_, ids)) in found.iter().enumerate() {
            if groups > 1 && shape.group_window(g).is_some() {
                h = longest_window_hit(shape, g, ids, h);
            }
        }
        if h == before {
            break;
        }
    }
    hit.num_blocks = h;
    hit.groups = found
        .into_iter()
        .enumerate()
        .map(|(g, (mut hashes, ids))| {
            let live = shape.group_first_live_block(g, h * bs).min(h);
            let live = if groups == 1 { 0 } else { live };
            let blocks = ids
                .iter()
                .take(h)
                .enumerate()
                .map(|(i, b)| match (i < live, b) {
                    (false, Some(b)) => *b,
                    _ => RELEASED_BLOCK,
                })
                .collect();
            hashes.truncate(h);
            GroupHit { blocks, hashes }
        })
        .collect();
    hit
}

/// The largest `e <= h` such that sliding group `group` has every block the window of
/// position `e * bs` reads (`0` always qualifies).
fn longest_window_hit(
    shape: &KvCacheShape,
    group: usize,
    ids: &[Option<BlockId>],
    h: usize,
) -> usize {
    let bs = shape.block_size_tokens;
    // run[i]: cached blocks in a row ending at block i.
    let mut run = Vec::with_capacity(h);
    for i in 0..h.min(ids.len()) {
        let prev = if i == 0 { 0 } else { run[i - 1] };
        run.push(if ids[i].is_some() { prev + 1 } else { 0 });
    }
    (1..=run.len())
        .rev()
        .find(|&e| run[e - 1] >= e - shape.group_first_live_block(group, e * bs).min(e))
        .unwrap_or(0)
}
