//! Per-sequence KV block tables over a [`BlockPool`], with prefix caching, one table per
//! KV group of layers ([`KvCacheShape::hybrid`]).
//!
//! The manager owns every block table, keyed by `SeqId`; a sequence never holds block
//! ids itself. Freeing a sequence (`free`) is therefore the one way blocks go back, and
//! the scheduler calls it on every path out of the running set (finish, abort, preempt,
//! failure). Owning the tables here instead of RAII guards in each sequence avoids a
//! shared `Rc<RefCell<BlockPool>>` back-reference while keeping one release path.
//!
//! With hybrid groups every group of a sequence covers the same positions: a sequence
//! that grows by a block takes one in every group, all from the one pool, so admission,
//! growth and preemption count blocks across groups. A sliding group releases its
//! blocks behind its window as the sequence moves on; a full group keeps them all.
//!
//! Invariants:
//! - each block's reference count equals the number of group tables that hold it;
//! - free blocks + blocks held by some table == total blocks;
//! - a group table holds block `i` for positions `[i * block_size, (i + 1) * block_size)`,
//!   and the groups of a sequence have the same length;
//! - a block is shared only when it is full and its whole token prefix (its chain hash,
//!   verified against the stored tokens) matches: partially filled blocks are private;
//! - with an attention window, a group table's first `live_from` entries are
//!   [`RELEASED_BLOCK`]: their blocks went back to the pool once the window of the
//!   sequence's next position had passed them, and every later entry is a block.

use std::collections::HashMap;

use tessera_protocol::{KvCacheShape, SeqId, RELEASED_BLOCK};

use crate::block_pool::{BlockHash, BlockId, BlockPool};
pub use crate::prefix_hit::PrefixHit;

/// Not enough free blocks; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
}

/// One group's table of one sequence.
#[derive(Debug, Default, Clone)]
struct SeqBlocks {
    blocks: Vec<BlockId>,
    /// Entries before this one are released (behind the attention window).
    live_from: usize,
    /// The parent of the first block's hash: the group's root under the cache salt.
    root: Option<BlockHash>,
    /// Chain hashes of the first `hashes.len()` blocks, whose content is known to be
    /// computed (registered in the prefix cache or found there).
    hashes: Vec<BlockHash>,
}

/// The paged KV cache as the scheduler sees it.
#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    /// Block size (at least 1), attention window and groups.
    shape: KvCacheShape,
    prefix_caching: bool,
    /// Per sequence, one table per group (`shape.num_groups()`).
    tables: HashMap<SeqId, Vec<SeqBlocks>>,
}

impl KvCacheManager {
    pub fn new(num_blocks: usize, block_size_tokens: usize, enable_prefix_caching: bool) -> Self {
        Self {
            pool: BlockPool::new(num_blocks),
            shape: KvCacheShape::new(num_blocks, block_size_tokens.max(1)),
            prefix_caching: enable_prefix_caching,
            tables: HashMap::new(),
        }
    }

    /// A manager for an executor's cache `shape`: its blocks, window and groups.
    pub fn for_shape(shape: KvCacheShape, enable_prefix_caching: bool) -> Self {
        let mut kv = Self::new(
            shape.num_blocks,
            shape.block_size_tokens,
            enable_prefix_caching,
        );
        kv.shape.attention_window = shape.attention_window;
        kv.shape.hybrid = shape.hybrid;
        kv
    }

    pub fn block_size_tokens(&self) -> usize {
        self.shape.block_size_tokens
    }

    /// KV groups: each sequence has this many block tables.
    pub fn num_groups(&self) -> usize {
        self.shape.num_groups()
    }

    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    pub fn num_used_blocks(&self) -> usize {
        self.pool.num_blocks() - self.pool.num_free()
    }

    /// Fraction of blocks held by some sequence (cached-but-free blocks count as free).
    pub fn usage(&self) -> f64 {
        if self.pool.num_blocks() == 0 {
            return 0.0;
        }
        self.num_used_blocks() as f64 / self.pool.num_blocks() as f64
    }

    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.pool.ref_count(block)
    }

    /// `seq`'s block table of group 0; entries behind the attention window are
    /// [`RELEASED_BLOCK`].
    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.group_table(seq, 0)
    }

    /// `seq`'s block table of group `group`.
    pub fn group_table(&self, seq: SeqId, group: usize) -> Option<&[BlockId]> {
        self.tables
            .get(&seq)
            .and_then(|t| t.get(group))
            .map(|t| t.blocks.as_slice())
    }

    /// What a chunk of `seq` carries: group 0's table, and the tables of groups 1..
    /// (see [`tessera_protocol::ScheduledChunk::group_tables`]).
    pub fn chunk_tables(&self, seq: SeqId) -> (Vec<BlockId>, Vec<Vec<BlockId>>) {
        let Some(groups) = self.tables.get(&seq) else {
            return (Vec::new(), Vec::new());
        };
        let mut tables = groups.iter().map(|t| t.blocks.clone());
        let first = tables.next().unwrap_or_default();
        (first, tables.collect())
    }

    pub fn has_table(&self, seq: SeqId) -> bool {
        self.tables.contains_key(&seq)
    }

    /// Blocks needed to hold `num_tokens` tokens, in each group.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.shape.block_size_tokens)
    }

    /// Longest cached prefix of `tokens`, in full blocks, leaving at least one token
    /// uncomputed so the executor has logits to sample from. Read-only.
    pub fn find_prefix(&self, tokens: &[u32]) -> PrefixHit {
        self.find_prefix_salted(tokens, None)
    }

    /// [`KvCacheManager::find_prefix`] among the blocks cached under `salt`: the salt is
    /// the parent of the first block's hash, so requests with different salts (or one
    /// with and one without) never share a block. Tables made from the hit keep the salt.
    /// With hybrid groups, the hit is the longest every group has (see
    /// [`crate::prefix_hit`]).
    pub fn find_prefix_salted(&self, tokens: &[u32], salt: Option<&str>) -> PrefixHit {
        let root = salt.map(BlockHash::salt);
        let max_blocks = match self.prefix_caching {
            true => tokens.len().saturating_sub(1) / self.shape.block_size_tokens,
            false => 0,
        };
        crate::prefix_hit::find(&self.pool, &self.shape, tokens, root, max_blocks)
    }

    /// Empty tables for every group, under the salt `root`.
    fn empty_tables(&self, root: Option<BlockHash>) -> Vec<SeqBlocks> {
        (0..self.shape.num_groups())
            .map(|g| SeqBlocks {
                root: BlockHash::group_root(root, g),
                ..SeqBlocks::default()
            })
            .collect()
    }

    /// Create `seq`'s tables: share the `hit` blocks, then allocate fresh blocks in every
    /// group until `num_tokens` tokens fit. All or nothing. `hit` must come from
    /// `find_prefix` with no pool change in between; a stale hit (a block evicted since)
    /// is dropped to the prefix that is still valid, and the returned count says how many
    /// tokens are cached. Hit blocks behind the attention window of the first uncached
    /// position are not taken: the table starts with them released.
    pub fn allocate(
        &mut self,
        seq: SeqId,
        hit: &PrefixHit,
        num_tokens: usize,
    ) -> Result<usize, OutOfBlocks> {
        if self.tables.contains_key(&seq) {
            // Allocation for an existing table is `grow`; keep the table as it is.
            return self.grow(seq, num_tokens).map(|()| 0);
        }
        let bs = self.shape.block_size_tokens;
        let valid = if hit.groups.len() == self.shape.num_groups() {
            hit.valid_blocks(&self.pool)
        } else {
            0
        };
        let groups = self.shape.num_groups();
        let fresh = self.blocks_for(num_tokens).saturating_sub(valid);
        let needed = fresh * groups;
        let live_from = |g: usize| self.shape.group_first_live_block(g, valid * bs).min(valid);
        // Shared blocks that sit in the free queue leave it, so they are not available
        // for fresh allocation.
        let revived: usize = (0..groups)
            .filter(|_| valid > 0)
            .map(|g| {
                hit.groups[g].blocks[live_from(g)..valid]
                    .iter()
                    .filter(|b| self.pool.is_free(**b))
                    .count()
            })
            .sum();
        let free = self.pool.num_free() - revived;
        if needed > free {
            return Err(OutOfBlocks { needed, free });
        }
        let mut tables = self.empty_tables(hit.root);
        // Every group takes its shared blocks before any takes a fresh one: a fresh
        // block comes from the free queue, where another group's hit may sit.
        for (g, table) in tables.iter_mut().enumerate() {
            let live = live_from(g);
            table.blocks.reserve(valid + fresh);
            table.blocks.resize(live, RELEASED_BLOCK);
            table.live_from = live;
            if valid > 0 {
                table.hashes = hit.groups[g].hashes[..valid].to_vec();
                for &b in &hit.groups[g].blocks[live..valid] {
                    self.pool.share(b);
                    table.blocks.push(b);
                }
            }
        }
        for table in &mut tables {
            for _ in 0..fresh {
                // Cannot fail: `needed <= free` was checked and nothing ran in between.
                if let Some(b) = self.pool.allocate() {
                    table.blocks.push(b);
                }
            }
        }
        self.tables.insert(seq, tables);
        Ok(valid * bs)
    }

    /// Grow `seq`'s tables so `num_tokens` tokens fit in every group. All or nothing; a
    /// no-op when they already fit. A sequence without a table gets fresh ones.
    pub fn grow(&mut self, seq: SeqId, num_tokens: usize) -> Result<(), OutOfBlocks> {
        let want = self.blocks_for(num_tokens);
        let needed = match self.tables.get(&seq) {
            Some(groups) => groups
                .iter()
                .map(|t| want.saturating_sub(t.blocks.len()))
                .sum(),
            None => want * self.shape.num_groups(),
        };
        let free = self.pool.num_free();
        if needed > free {
            return Err(OutOfBlocks { needed, free });
        }
        if needed == 0 {
            return Ok(());
        }
        if !self.tables.contains_key(&seq) {
            let tables = self.empty_tables(None);
            self.tables.insert(seq, tables);
        }
        let Some(groups) = self.tables.get_mut(&seq) else {
            return Ok(());
        };
        for table in groups {
            while table.blocks.len() < want {
                match self.pool.allocate() {
                    Some(b) => table.blocks.push(b),
                    None => break,
                }
            }
        }
        Ok(())
    }

    /// Record that the first `num_computed` of `tokens` are in `seq`'s KV: every full
    /// block among them becomes a prefix-cache entry, in every group. Call only after
    /// the executor finished the step that computed them, so a hit never points at KV in
    /// flight.
    pub fn commit_computed(&mut self, seq: SeqId, tokens: &[u32], num_computed: usize) {
        if !self.prefix_caching {
            return;
        }
        let Some(groups) = self.tables.get_mut(&seq) else {
            return;
        };
        let bs = self.shape.block_size_tokens;
        for table in groups {
            let full = (num_computed.min(tokens.len()) / bs).min(table.blocks.len());
            while table.hashes.len() < full {
                let i = table.hashes.len();
                if table.blocks[i] == RELEASED_BLOCK {
                    // Released before its hash was known: the chain cannot go on. (Blocks
                    // are released only after the step that computed them committed them.)
                    break;
                }
                let chunk = &tokens[i * bs..(i + 1) * bs];
                let parent = table.hashes.last().copied().or(table.root);
                let hash = BlockHash::chain(parent, chunk);
                self.pool.register(table.blocks[i], hash, parent, chunk);
                table.hashes.push(hash);
            }
        }
    }

    /// Release the blocks of `seq` that are behind the attention window of position
    /// `next_pos`, the first position still to be computed, in every sliding group: no
    /// later step reads them. Committed blocks keep their cached content in the pool, so
    /// a later request with the same prefix can still find them until they are evicted.
    pub fn release_behind_window(&mut self, seq: SeqId, next_pos: usize) {
        if self.shape.attention_window.is_none() {
            return;
        }
        let Some(groups) = self.tables.get_mut(&seq) else {
            return;
        };
        for (g, table) in groups.iter_mut().enumerate() {
            let first_live = self.shape.group_first_live_block(g, next_pos);
            let end = first_live.min(table.blocks.len());
            for i in table.live_from..end {
                self.pool.release(table.blocks[i]);
                table.blocks[i] = RELEASED_BLOCK;
            }
            table.live_from = table.live_from.max(end);
        }
    }

    /// Give `child` the first `num_tokens / block_size` full blocks of `parent` in every
    /// group, shared (for parallel sampling: a child continues the parent's prompt).
    /// Returns the number of tokens shared (0 when the parent's window has moved past
    /// blocks the child needs), or `None` when `parent` has no table or `child` already
    /// has one.
    pub fn fork(&mut self, parent: SeqId, child: SeqId, num_tokens: usize) -> Option<usize> {
        if self.tables.contains_key(&child) {
            return None;
        }
        let src = self.tables.get(&parent)?;
        let bs = self.shape.block_size_tokens;
        let mut n = src
            .iter()
            .map(|t| t.blocks.len())
            .min()
            .unwrap_or(0)
            .min(num_tokens / bs);
        if src
            .iter()
            .enumerate()
            .any(|(g, t)| t.live_from > self.shape.group_first_live_block(g, n * bs))
        {
            // The parent released blocks the child's next position still reads: the
            // child computes its prefix itself.
            n = 0;
        }
        let tables: Vec<SeqBlocks> = src
            .iter()
            .map(|t| SeqBlocks {
                blocks: t.blocks[..n].to_vec(),
                live_from: t.live_from.min(n),
                root: t.root,
                hashes: t.hashes[..n.min(t.hashes.len())].to_vec(),
            })
            .collect();
        for t in &tables {
            for &b in &t.blocks[t.live_from..] {
                self.pool.share(b);
            }
        }
        self.tables.insert(child, tables);
        Some(n * bs)
    }

    /// Drop `seq`'s tables and release their blocks, last block first so that the tail
    /// of a prompt (least likely to be shared) is evicted before its head. Returns
    /// whether the sequence had a table.
    pub fn free(&mut self, seq: SeqId) -> bool {
        let Some(groups) = self.tables.remove(&seq) else {
            return false;
        };
        for table in &groups {
            for &b in table.blocks[table.live_from..].iter().rev() {
                self.pool.release(b);
            }
        }
        true
    }

    /// Forget every cached prefix (after an executor failure the KV cannot be trusted).
    pub fn reset_prefix_cache(&mut self) {
        self.pool.reset_cache();
        for t in self.tables.values_mut().flatten() {
            t.hashes.clear();
        }
    }

    /// Check the pool's invariants and that reference counts equal table membership.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut holders = vec![0u32; self.pool.num_blocks()];
        for (seq, groups) in &self.tables {
            if groups.len() != self.shape.num_groups() {
                return Err(format!(
                    "{seq}: {} tables for {} groups",
                    groups.len(),
                    self.shape.num_groups()
                ));
            }
            for (g, t) in groups.iter().enumerate() {
                let (released, live) = t.blocks.split_at(t.live_from.min(t.blocks.len()));
                if released.iter().any(|b| *b != RELEASED_BLOCK) || live.contains(&RELEASED_BLOCK) {
                    return Err(format!(
                        "{seq} group {g}: entries before {} must be released, and only they",
                        t.live_from
                    ));
                }
                for &b in live {
                    let slot = holders
                        .get_mut(b as usize)
                        .ok_or(format!("{seq} holds out-of-range block {b}"))?;
                    *slot += 1;
                }
            }
        }
        for (b, &n) in holders.iter().enumerate() {
            if self.pool.ref_count(b as BlockId) != n {
                return Err(format!(
                    "block {b}: ref_count {} but held by {n} tables",
                    self.pool.ref_count(b as BlockId)
                ));
            }
        }
        let used = holders.iter().filter(|&&n| n > 0).count();
        if used + self.pool.num_free() != self.pool.num_blocks() {
            return Err(format!(
                "{used} used + {} free != {} total",
                self.pool.num_free(),
                self.pool.num_blocks()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: SeqId = SeqId(1);
    const B: SeqId = SeqId(2);

    #[test]
    fn prefix_hit_shares_full_blocks_and_leaves_one_token() {
        let mut kv = KvCacheManager::new(8, 4, true);
        let prompt: Vec<u32> = (0..12).collect();
        assert_eq!(kv.allocate(A, &kv.find_prefix(&prompt), 12), Ok(0));
        kv.commit_computed(A, &prompt, 12);
        // Same 12 tokens: only 2 blocks may hit, so the last token is computed again.
        let hit = kv.find_prefix(&prompt);
        assert_eq!(hit.num_tokens(), 8);
        assert_eq!(kv.allocate(B, &hit, 12), Ok(8));
        let (ta, tb) = (kv.block_table(A), kv.block_table(B));
        assert_eq!(ta.map(|t| &t[..2]), tb.map(|t| &t[..2]));
        assert_ne!(ta.map(|t| t[2]), tb.map(|t| t[2]));
        assert_eq!(kv.ref_count(hit.blocks()[0]), 2);
        assert_eq!(kv.num_used_blocks(), 4);
        assert_eq!(kv.check_invariants(), Ok(()));
    }

    #[test]
    fn out_of_blocks_changes_nothing() {
        let mut kv = KvCacheManager::new(2, 4, true);
        assert_eq!(
            kv.allocate(A, &PrefixHit::default(), 9),
            Err(OutOfBlocks { needed: 3, free: 2 })
        );
        assert!(!kv.has_table(A));
        assert_eq!(kv.num_free_blocks(), 2);
        assert_eq!(kv.grow(A, 8), Ok(()));
        assert_eq!(kv.grow(A, 9), Err(OutOfBlocks { needed: 1, free: 0 }));
        assert_eq!(kv.block_table(A).map(<[u32]>::len), Some(2));
    }

    #[test]
    fn freed_prefix_is_revived_until_evicted() {
        let mut kv = KvCacheManager::new(3, 2, true);
        let p = [1, 2, 3, 4, 5];
        assert_eq!(kv.allocate(A, &PrefixHit::default(), 5), Ok(0));
        kv.commit_computed(A, &p, 5);
        assert!(kv.free(A));
        assert_eq!(kv.num_free_blocks(), 3);
        assert_eq!(kv.find_prefix(&p).num_tokens(), 4);
        // A different 6-token sequence needs all 3 blocks and evicts the cached ones.
        assert_eq!(kv.allocate(B, &PrefixHit::default(), 6), Ok(0));
        kv.free(B);
        assert_eq!(kv.find_prefix(&p).num_tokens(), 0);
        assert_eq!(kv.check_invariants(), Ok(()));
    }

    #[test]
    fn salted_blocks_are_shared_under_the_same_salt_only() {
        let mut kv = KvCacheManager::new(16, 2, true);
        let p: Vec<u32> = (0..7).collect();
        let hit = kv.find_prefix_salted(&p, Some("tenant-a"));
        assert_eq!(kv.allocate(A, &hit, 7), Ok(0));
        kv.commit_computed(A, &p, 7);
        assert_eq!(kv.find_prefix_salted(&p, Some("tenant-a")).num_tokens(), 6);
        assert_eq!(kv.find_prefix_salted(&p, Some("tenant-b")).num_tokens(), 0);
        assert_eq!(kv.find_prefix(&p).num_tokens(), 0);
        // A table made from a salted hit registers its own blocks under the salt too.
        let longer: Vec<u32> = (0..11).collect();
        let hit = kv.find_prefix_salted(&longer, Some("tenant-a"));
        assert_eq!(kv.allocate(B, &hit, 11), Ok(6));
        kv.commit_computed(B, &longer, 11);
        assert_eq!(
            kv.find_prefix_salted(&longer, Some("tenant-a"))
                .num_tokens(),
            10
        );
        assert_eq!(kv.find_prefix(&longer).num_tokens(), 0);
        assert_eq!(kv.check_invariants(), Ok(()));
    }

    #[test]
    fn disabled_prefix_caching_never_hits() {
        let mut kv = KvCacheManager::new(4, 2, false);
        let p = [1, 2, 3];
        assert_eq!(kv.allocate(A, &PrefixHit::default(), 3), Ok(0));
        kv.commit_computed(A, &p, 3);
        assert_eq!(kv.find_prefix(&p).num_tokens(), 0);
    }
}
