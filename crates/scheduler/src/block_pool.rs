//! The pool of physical KV blocks: reference counts, the free queue, and the
//! prefix-cache index from block hash to block.
//!
//! Invariants (checked by [`BlockPool::check_invariants`] and the property tests):
//! - a block is in the free queue exactly when its reference count is 0;
//! - every entry of the hash index points at a block whose `cached` content carries that
//!   hash, and every block with `cached` content is the block the index names for it;
//! - free blocks keep their cached content until they are handed out again (eviction),
//!   so a later request with the same prefix can revive them.
//!
//! The free queue is ordered for eviction: blocks without content sit at the front and are
//! handed out first; freed blocks with cached content go to the back, so the least
//! recently freed cached block is evicted first (LRU).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// Index of a physical KV block in the executor's cache.
pub type BlockId = u32;

/// Hash of a full block's tokens chained with its parent block's hash, so a block hash
/// names the whole prefix up to the block's end and position is implied by the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u64);

impl BlockHash {
    /// Hash of a block whose tokens are `tokens` and whose predecessor has `parent`.
    /// The root a salted request's first block hangs from.
    pub fn salt(salt: &str) -> BlockHash {
        let mut h = DefaultHasher::new();
        "cache_salt".hash(&mut h);
        salt.hash(&mut h);
        BlockHash(h.finish())
    }

    /// The root of group `group`'s chains under `root` (the salt, if any): hybrid KV
    /// groups hold different layers' KV for the same tokens, so each group caches its
    /// blocks under its own hashes. Group 0 keeps `root` itself.
    pub fn group_root(root: Option<BlockHash>, group: usize) -> Option<BlockHash> {
        if group == 0 {
            return root;
        }
        let mut h = DefaultHasher::new();
        "kv_group".hash(&mut h);
        root.map(|r| r.0).hash(&mut h);
        group.hash(&mut h);
        Some(BlockHash(h.finish()))
    }

    pub fn chain(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
        // `DefaultHasher::new()` has fixed keys, so hashes are stable within a process,
        // which is all the in-memory prefix cache needs.
        let mut h = DefaultHasher::new();
        parent.map(|p| p.0).hash(&mut h);
        tokens.hash(&mut h);
        BlockHash(h.finish())
    }
}

/// What a cached block holds. The tokens and parent are kept so a hash collision can
/// never share a block whose tokens differ: lookups compare them, not just the hash.
#[derive(Debug, Clone)]
struct CachedContent {
    hash: BlockHash,
    parent: Option<BlockHash>,
    tokens: Box<[u32]>,
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct BlockMeta {
    ref_count: u32,
    cached: Option<CachedContent>,
    // Intrusive doubly linked free queue; both NIL when not queued (or at an end).
    prev: u32,
    next: u32,
    queued: bool,
}

/// All physical blocks with their reference counts, free queue and prefix index.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<BlockMeta>,
    head: u32,
    tail: u32,
    num_free: usize,
    index: HashMap<BlockHash, BlockId>,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks. `num_blocks` must fit in `u32` (checked by
    /// config resolution); larger values are truncated to `u32::MAX - 1` blocks.
    pub fn new(num_blocks: usize) -> Self {
        let n = num_blocks.min((NIL - 1) as usize);
        let mut pool = BlockPool {
            blocks: vec![
                BlockMeta {
                    ref_count: 0,
                    cached: None,
                    prev: NIL,
                    next: NIL,
                    queued: false,
                };
                n
            ],
            head: NIL,
            tail: NIL,
            num_free: 0,
            index: HashMap::new(),
        };
        for id in 0..n as u32 {
            pool.push_back(id);
        }
        pool
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks with reference count 0 (including evictable cached ones).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks.get(id as usize).map_or(0, |b| b.ref_count)
    }

    /// True when the block is free (and would have to leave the free queue to be used).
    pub fn is_free(&self, id: BlockId) -> bool {
        self.blocks.get(id as usize).is_some_and(|b| b.queued)
    }

    /// Take a block from the front of the free queue for new content, evicting whatever
    /// it cached. Returns it with reference count 1.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        self.evict(id);
        let meta = &mut self.blocks[id as usize];
        meta.ref_count = 1;
        Some(id)
    }

    /// Add a reference to a block that a sequence shares (a prefix hit or a fork),
    /// reviving it from the free queue if needed.
    pub fn share(&mut self, id: BlockId) {
        if self.blocks.get(id as usize).is_none() {
            return;
        }
        if self.blocks[id as usize].queued {
            self.unlink(id);
        }
        self.blocks[id as usize].ref_count += 1;
    }

    /// Drop one reference. At zero the block joins the free queue: at the back when it
    /// holds cached content (evicted last), at the front otherwise (reused first).
    pub fn release(&mut self, id: BlockId) {
        let Some(meta) = self.blocks.get_mut(id as usize) else {
            return;
        };
        // A release of a free block would be a double free: refuse it rather than queue
        // the block twice. The property tests check this never happens.
        debug_assert!(meta.ref_count > 0, "double free of block {id}");
        if meta.ref_count == 0 {
            tracing::error!(block = id, "double free of KV block ignored");
            return;
        }
        meta.ref_count -= 1;
        if meta.ref_count == 0 {
            if meta.cached.is_some() {
                self.push_back(id);
            } else {
                self.push_front(id);
            }
        }
    }

    /// The cached block holding exactly `tokens` after `parent`, if any.
    pub fn lookup(
        &self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> Option<BlockId> {
        let id = *self.index.get(&hash)?;
        let content = self.blocks.get(id as usize)?.cached.as_ref()?;
        (content.hash == hash && content.parent == parent && *content.tokens == *tokens)
            .then_some(id)
    }

    /// The hash of a block's cached content, if it has any.
    pub fn cached_hash(&self, id: BlockId) -> Option<BlockHash> {
        self.blocks
            .get(id as usize)?
            .cached
            .as_ref()
            .map(|c| c.hash)
    }

    /// Record that an in-use block now holds `tokens` (computed KV). If another block
    /// already holds the same content, this one stays unindexed: one block per hash.
    pub fn register(
        &mut self,
        id: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) {
        let Some(meta) = self.blocks.get(id as usize) else {
            return;
        };
        if meta.cached.is_some() || self.index.contains_key(&hash) {
            return;
        }
        self.index.insert(hash, id);
        self.blocks[id as usize].cached = Some(CachedContent {
            hash,
            parent,
            tokens: tokens.into(),
        });
    }

    /// Forget all cached content, e.g. after an executor failure when no KV can be
    /// trusted. Free blocks stay free; nothing is shared from before the reset.
    pub fn reset_cache(&mut self) {
        self.index.clear();
        for meta in &mut self.blocks {
            meta.cached = None;
        }
    }

    /// Number of blocks whose content is indexed for prefix hits.
    pub fn num_cached(&self) -> usize {
        self.index.len()
    }

    /// Check every invariant stated in the module header; `Err` describes the first
    /// violation. Linear in the pool size: for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = vec![false; self.blocks.len()];
        let mut count = 0usize;
        let mut prev = NIL;
        let mut cur = self.head;
        while cur != NIL {
            let meta = self
                .blocks
                .get(cur as usize)
                .ok_or(format!("free queue names block {cur} out of range"))?;
            if seen[cur as usize] {
                return Err(format!("block {cur} is twice in the free queue"));
            }
            seen[cur as usize] = true;
            if !meta.queued || meta.ref_count != 0 || meta.prev != prev {
                return Err(format!(
                    "free block {cur}: queued={} ref_count={} prev={} (expected {prev})",
                    meta.queued, meta.ref_count, meta.prev
                ));
            }
            count += 1;
            prev = cur;
            cur = meta.next;
        }
        if prev != self.tail || count != self.num_free {
            return Err(format!(
                "free queue walk found {count} blocks ending at {prev}; counters say {} ending at {}",
                self.num_free, self.tail
            ));
        }
        for (id, meta) in self.blocks.iter().enumerate() {
            if (meta.ref_count == 0) != seen[id] || meta.queued != seen[id] {
                return Err(format!(
                    "block {id}: ref_count={} queued={} but in free queue={}",
                    meta.ref_count, meta.queued, seen[id]
                ));
            }
            if let Some(c) = &meta.cached {
                if self.index.get(&c.hash) != Some(&(id as u32)) {
                    return Err(format!(
                        "block {id} has cached content missing from the index"
                    ));
                }
            }
        }
        for (hash, &id) in &self.index {
            let ok = self
                .blocks
                .get(id as usize)
                .and_then(|m| m.cached.as_ref())
                .is_some_and(|c| c.hash == *hash);
            if !ok {
                return Err(format!("index entry {hash:?} -> {id} is stale"));
            }
        }
        Ok(())
    }

    /// Drop a block's cached content (it is about to be overwritten).
    fn evict(&mut self, id: BlockId) {
        if let Some(content) = self.blocks[id as usize].cached.take() {
            if self.index.get(&content.hash) == Some(&id) {
                self.index.remove(&content.hash);
            }
        }
    }

    fn push_back(&mut self, id: BlockId) {
        let old_tail = self.tail;
        {
            let meta = &mut self.blocks[id as usize];
            meta.prev = old_tail;
            meta.next = NIL;
            meta.queued = true;
        }
        if old_tail == NIL {
            self.head = id;
        } else {
            self.blocks[old_tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    fn push_front(&mut self, id: BlockId) {
        let old_head = self.head;
        {
            let meta = &mut self.blocks[id as usize];
            meta.prev = NIL;
            meta.next = old_head;
            meta.queued = true;
        }
        if old_head == NIL {
            self.tail = id;
        } else {
            self.blocks[old_head as usize].prev = id;
        }
        self.head = id;
        self.num_free += 1;
    }

    fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let meta = &mut self.blocks[id as usize];
            let links = (meta.prev, meta.next);
            meta.prev = NIL;
            meta.next = NIL;
            meta.queued = false;
            links
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_until_empty_then_release_restores_all() {
        let mut pool = BlockPool::new(3);
        let got: Vec<_> = (0..4).map(|_| pool.allocate()).collect();
        assert_eq!(got, vec![Some(0), Some(1), Some(2), None]);
        assert_eq!(pool.num_free(), 0);
        pool.release(1);
        assert_eq!(pool.num_free(), 1);
        assert_eq!(pool.allocate(), Some(1));
        for id in 0..3 {
            pool.release(id);
        }
        assert_eq!(pool.num_free(), 3);
        assert_eq!(pool.check_invariants(), Ok(()));
    }

    #[test]
    fn cached_free_blocks_are_evicted_after_uncached_ones_in_lru_order() {
        let mut pool = BlockPool::new(3);
        let (a, b, c) = (pool.allocate(), pool.allocate(), pool.allocate());
        assert_eq!((a, b, c), (Some(0), Some(1), Some(2)));
        let ha = BlockHash::chain(None, &[1, 2]);
        let hb = BlockHash::chain(None, &[3, 4]);
        pool.register(0, ha, None, &[1, 2]);
        pool.register(1, hb, None, &[3, 4]);
        pool.release(0); // cached, freed first: evicted first among cached
        pool.release(1);
        pool.release(2); // uncached: handed out before any cached block
        assert_eq!(pool.allocate(), Some(2));
        assert_eq!(pool.lookup(ha, None, &[1, 2]), Some(0));
        assert_eq!(pool.allocate(), Some(0));
        assert_eq!(
            pool.lookup(ha, None, &[1, 2]),
            None,
            "evicted content is gone"
        );
        assert_eq!(pool.lookup(hb, None, &[3, 4]), Some(1));
        assert_eq!(pool.check_invariants(), Ok(()));
    }

    #[test]
    fn lookup_compares_tokens_not_only_the_hash() {
        let mut pool = BlockPool::new(1);
        let id = pool.allocate().unwrap_or(NIL);
        let h = BlockHash::chain(None, &[7, 8]);
        pool.register(id, h, None, &[7, 8]);
        // Same hash value, different tokens: must miss (as if the hash collided).
        assert_eq!(pool.lookup(h, None, &[7, 9]), None);
        assert_eq!(pool.lookup(h, Some(h), &[7, 8]), None);
        assert_eq!(pool.lookup(h, None, &[7, 8]), Some(id));
    }

    #[test]
    fn sharing_a_free_cached_block_revives_it() {
        let mut pool = BlockPool::new(2);
        let id = pool.allocate().unwrap_or(NIL);
        let h = BlockHash::chain(None, &[5]);
        pool.register(id, h, None, &[5]);
        pool.release(id);
        assert!(pool.is_free(id));
        pool.share(id);
        assert_eq!(pool.ref_count(id), 1);
        assert_eq!(pool.num_free(), 1);
        assert_eq!(pool.cached_hash(id), Some(h));
        assert_eq!(pool.check_invariants(), Ok(()));
    }
}
