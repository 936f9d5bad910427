//! Property tests of the KV block manager against a model of what each block holds.
//!
//! The model records, for every block, the token prefix (positions 0 .. block end) that
//! was written into it when it was last handed out fresh. A sequence may hold a block
//! only if its own tokens match that record: so sharing a block whose tokens differ, or
//! writing into a block someone else reads, fails the test.
//!
//! With an attention window, every sequence releases the blocks behind the window of its
//! next position after each write; the model then checks that exactly those entries are
//! released and that every other entry still holds the sequence's own tokens.
//!
//! With hybrid KV groups (full groups, then sliding ones) every group of a sequence is
//! checked the same way against its own window, and a block records the group it was
//! written for: a block of one group never shows up in another's table.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;
use tessera_protocol::{KvCacheShape, KvGroups, SeqId, RELEASED_BLOCK};
use tessera_scheduler::{BlockId, KvCacheManager};

const BLOCK: usize = 2;
const NUM_BLOCKS: usize = 12;
const MAX_SEQS: u64 = 6;

#[derive(Debug, Clone)]
enum Op {
    /// Allocate a new sequence with these tokens (through the prefix cache).
    Start(u64, Vec<u32>),
    /// Append tokens to a sequence (decode or a later prefill chunk).
    Append(u64, Vec<u32>),
    /// Share the parent's full blocks with a new child sequence.
    Fork(u64, u64),
    Free(u64),
    /// Free, then restart later with the same tokens (recompute).
    Preempt(u64),
    Resume(u64),
}

fn tokens(max: usize) -> impl Strategy<Value = Vec<u32>> {
    // A two-letter alphabet makes shared prefixes (and hash-chain reuse) common.
    prop::collection::vec(0u32..2, 1..max)
}

fn op() -> impl Strategy<Value = Op> {
    let seq = 0..MAX_SEQS;
    prop_oneof![
        3 => (seq.clone(), tokens(10)).prop_map(|(s, t)| Op::Start(s, t)),
        3 => (seq.clone(), tokens(4)).prop_map(|(s, t)| Op::Append(s, t)),
        1 => (seq.clone(), seq.clone()).prop_map(|(a, b)| Op::Fork(a, b)),
        2 => seq.clone().prop_map(Op::Free),
        1 => seq.clone().prop_map(Op::Preempt),
        1 => seq.prop_map(Op::Resume),
    ]
}

#[derive(Default)]
struct Model {
    /// Per KV group, the positions each token attends to (`None`: the whole context).
    windows: Vec<Option<usize>>,
    num_blocks: usize,
    /// Tokens of each live sequence (all computed).
    live: BTreeMap<u64, Vec<u32>>,
    /// Tokens of preempted sequences, waiting to resume.
    preempted: HashMap<u64, Vec<u32>>,
    /// What was written into each block: its group, and the token prefix through its
    /// last slot.
    content: HashMap<BlockId, (usize, Vec<u32>)>,
}

impl Model {
    fn expected_content(g: usize, tokens: &[u32], i: usize) -> (usize, Vec<u32>) {
        (g, tokens[..((i + 1) * BLOCK).min(tokens.len())].to_vec())
    }

    /// Blocks of group `g` wholly before the window of position `next`: the token there
    /// reads positions `next + 1 - window ..= next`.
    fn released_before(&self, g: usize, next: usize) -> usize {
        self.windows[g].map_or(0, |w| (next + 1).saturating_sub(w) / BLOCK)
    }

    fn table(kv: &KvCacheManager, seq: u64, g: usize) -> Vec<BlockId> {
        kv.group_table(SeqId(seq), g).unwrap().to_vec()
    }

    /// After `seq` computed all its tokens: commit them and release what is behind.
    fn commit(&self, kv: &mut KvCacheManager, seq: u64) {
        let tokens = &self.live[&seq];
        kv.commit_computed(SeqId(seq), tokens, tokens.len());
        kv.release_behind_window(SeqId(seq), tokens.len());
    }

    /// Blocks `from..` of `seq`'s table were just handed out fresh: record what the
    /// sequence writes into them.
    fn write_fresh(&mut self, kv: &KvCacheManager, seq: u64, from: usize) {
        let tokens = &self.live[&seq];
        for g in 0..self.windows.len() {
            let table = Self::table(kv, seq, g);
            for (i, &b) in table.iter().enumerate().skip(from) {
                if b == RELEASED_BLOCK {
                    continue;
                }
                assert_eq!(kv.ref_count(b), 1, "fresh block {b} is shared");
                self.content.insert(b, Self::expected_content(g, tokens, i));
            }
        }
    }

    fn start(&mut self, kv: &mut KvCacheManager, seq: u64, tokens: Vec<u32>) {
        let hit = kv.find_prefix(&tokens);
        assert!(
            hit.num_tokens() < tokens.len(),
            "hit leaves a token to compute"
        );
        let Ok(cached) = kv.allocate(SeqId(seq), &hit, tokens.len()) else {
            assert!(!kv.has_table(SeqId(seq)));
            return;
        };
        assert_eq!(cached, hit.num_tokens());
        self.live.insert(seq, tokens);
        // Cached blocks must already hold exactly this sequence's prefix, in each group
        // every block its window at the hit still reads.
        for g in 0..self.windows.len() {
            let table = Self::table(kv, seq, g);
            for (i, b) in table.iter().enumerate().take(cached / BLOCK) {
                if *b == RELEASED_BLOCK {
                    assert!(
                        i < self.released_before(g, cached),
                        "group {g} block {i} released too early"
                    );
                    continue;
                }
                assert_eq!(
                    self.content.get(b),
                    Some(&Self::expected_content(g, &self.live[&seq], i)),
                    "prefix hit on block {b} of group {g} with different tokens"
                );
            }
        }
        self.write_fresh(kv, seq, cached / BLOCK);
        // The partially reused last block never comes from the cache: positions past
        // `cached` are written only into fresh blocks.
        self.commit(kv, seq);
    }

    fn apply(&mut self, kv: &mut KvCacheManager, op: Op) {
        match op {
            Op::Start(s, t) => {
                if !self.live.contains_key(&s) && !self.preempted.contains_key(&s) {
                    self.start(kv, s, t);
                }
            }
            Op::Append(s, extra) => {
                let Some(tokens) = self.live.get(&s) else {
                    return;
                };
                let old_len = tokens.len();
                let old_blocks = kv.block_table(SeqId(s)).unwrap().len();
                if kv.grow(SeqId(s), old_len + extra.len()).is_err() {
                    for g in 0..self.windows.len() {
                        assert_eq!(Self::table(kv, s, g).len(), old_blocks, "partial grow");
                    }
                    return;
                }
                let tokens = self.live.get_mut(&s).unwrap();
                tokens.extend(extra);
                let tokens = tokens.clone();
                // Every block receiving new positions must be private to this sequence.
                for g in 0..self.windows.len() {
                    let table = Self::table(kv, s, g);
                    for pos in old_len..tokens.len() {
                        let b = table[pos / BLOCK];
                        assert_eq!(kv.ref_count(b), 1, "write into shared block {b}");
                        self.content
                            .insert(b, Model::expected_content(g, &tokens, pos / BLOCK));
                    }
                }
                self.commit(kv, s);
            }
            Op::Fork(parent, child) => {
                if self.live.contains_key(&child) || self.preempted.contains_key(&child) {
                    return;
                }
                let Some(tokens) = self.live.get(&parent).cloned() else {
                    return;
                };
                let shared = kv.fork(SeqId(parent), SeqId(child), tokens.len()).unwrap();
                // Nothing is shared when the parent released blocks the child still needs.
                let full = tokens.len() / BLOCK * BLOCK;
                let complete = (0..self.windows.len()).all(|g| {
                    self.released_before(g, tokens.len()) <= self.released_before(g, full)
                });
                assert_eq!(shared, if complete { full } else { 0 });
                if shared == 0 {
                    // An empty table still counts as a sequence; keep the model in step.
                    for g in 0..self.windows.len() {
                        assert_eq!(kv.group_table(SeqId(child), g).map(<[u32]>::len), Some(0));
                    }
                }
                self.live.insert(child, tokens[..shared].to_vec());
            }
            Op::Free(s) => {
                let had = self.live.remove(&s).is_some();
                assert_eq!(kv.free(SeqId(s)), had);
                self.preempted.remove(&s);
            }
            Op::Preempt(s) => {
                if let Some(tokens) = self.live.remove(&s) {
                    assert!(kv.free(SeqId(s)));
                    self.preempted.insert(s, tokens);
                }
            }
            Op::Resume(s) => {
                if let Some(tokens) = self.preempted.remove(&s) {
                    if tokens.is_empty() {
                        return;
                    }
                    self.start(kv, s, tokens.clone());
                    if !self.live.contains_key(&s) {
                        self.preempted.insert(s, tokens);
                    }
                }
            }
        }
    }

    fn check(&self, kv: &KvCacheManager) {
        kv.check_invariants().unwrap();
        let mut holders: HashMap<BlockId, usize> = HashMap::new();
        for (&s, tokens) in &self.live {
            for g in 0..self.windows.len() {
                let table = Self::table(kv, s, g);
                assert_eq!(
                    table.len(),
                    tokens.len().div_ceil(BLOCK),
                    "table size of {s} group {g}"
                );
                let released = self.released_before(g, tokens.len());
                let (gone, table) = table.split_at(released.min(table.len()));
                assert!(
                    gone.iter().all(|b| *b == RELEASED_BLOCK),
                    "seq {s} holds a block of group {g} behind its window"
                );
                let distinct: HashSet<_> = table.iter().collect();
                assert_eq!(distinct.len(), table.len(), "block twice in one table");
                for (i, &b) in table.iter().enumerate() {
                    let i = i + gone.len();
                    *holders.entry(b).or_default() += 1;
                    assert_eq!(
                        self.content.get(&b),
                        Some(&Model::expected_content(g, tokens, i)),
                        "seq {s} group {g} block {i} (#{b}) holds other tokens"
                    );
                }
            }
        }
        for b in 0..self.num_blocks as BlockId {
            let n = holders.get(&b).copied().unwrap_or(0);
            assert_eq!(kv.ref_count(b) as usize, n, "ref count of block {b}");
        }
        assert_eq!(
            holders.len() + kv.num_free_blocks(),
            self.num_blocks,
            "blocks leaked or double-freed"
        );
        assert_eq!(kv.num_used_blocks(), holders.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn block_manager_keeps_its_invariants(
        ops in prop::collection::vec(op(), 1..80),
        window in prop::option::of(1..7usize),
        hybrid in prop::option::of((1..3usize, 1..4usize)),
    ) {
        // Hybrid groups only with a window; each group gets the blocks one group had.
        let hybrid = hybrid
            .filter(|_| window.is_some())
            .map(|(full, sliding)| KvGroups { full, sliding });
        let groups = hybrid.map_or(1, |h| h.full + h.sliding);
        let shape = KvCacheShape {
            attention_window: window,
            hybrid,
            ..KvCacheShape::new(NUM_BLOCKS * groups, BLOCK)
        };
        let mut kv = KvCacheManager::for_shape(shape, true);
        let windows = (0..groups).map(|g| shape.group_window(g)).collect();
        let mut model = Model { windows, num_blocks: NUM_BLOCKS * groups, ..Model::default() };
        for op in ops {
            model.apply(&mut kv, op);
            model.check(&kv);
        }
        let live: Vec<u64> = model.live.keys().copied().collect();
        for s in live {
            model.apply(&mut kv, Op::Free(s));
            model.check(&kv);
        }
        prop_assert_eq!(kv.num_free_blocks(), NUM_BLOCKS * groups);
        prop_assert_eq!(kv.num_used_blocks(), 0);
    }
}
