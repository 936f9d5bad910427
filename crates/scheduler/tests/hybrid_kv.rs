//! The block manager with hybrid KV groups: one full-attention group and sliding
//! groups, each with its own table per sequence, all drawing from one pool.
#![allow(clippy::unwrap_used)]

use tessera_protocol::{KvCacheShape, KvGroups, SeqId, RELEASED_BLOCK};
use tessera_scheduler::{KvCacheManager, PrefixHit};

const A: SeqId = SeqId(1);
const B: SeqId = SeqId(2);

/// Block size 4, window 8; one full group and `sliding` sliding groups.
fn hybrid(num_blocks: usize, sliding: usize) -> KvCacheManager {
    let shape = KvCacheShape {
        attention_window: Some(8),
        hybrid: Some(KvGroups { full: 1, sliding }),
        ..KvCacheShape::new(num_blocks, 4)
    };
    KvCacheManager::for_shape(shape, true)
}

fn live(table: &[u32]) -> usize {
    table.iter().filter(|b| **b != RELEASED_BLOCK).count()
}

#[test]
fn sliding_groups_release_behind_the_window_and_the_full_group_keeps_all() {
    let mut kv = hybrid(64, 2);
    let prompt: Vec<u32> = (0..24).collect();
    assert_eq!(kv.allocate(A, &PrefixHit::default(), 24), Ok(0));
    // Every group holds 6 blocks: 18 from the pool.
    assert_eq!(kv.num_used_blocks(), 18);
    kv.commit_computed(A, &prompt, 24);
    kv.release_behind_window(A, 24);
    // Position 24 reads 17..=24: blocks 0..4 (positions 0..16) are behind the window.
    assert_eq!(kv.group_table(A, 0).map(live), Some(6));
    for g in 1..3 {
        let t = kv.group_table(A, g).unwrap();
        assert_eq!(&t[..4], &[RELEASED_BLOCK; 4]);
        assert_eq!(live(t), 2);
    }
    assert_eq!(kv.num_used_blocks(), 6 + 2 * 2);
    // A chunk's tables: group 0 first, the others beside it.
    let (first, others) = kv.chunk_tables(A);
    assert_eq!(Some(first.as_slice()), kv.block_table(A));
    assert_eq!(others.len(), 2);
    kv.check_invariants().unwrap();
    assert!(kv.free(A));
    assert_eq!(kv.num_used_blocks(), 0);
    kv.check_invariants().unwrap();
}

#[test]
fn growing_takes_a_block_in_every_group_or_none() {
    let mut kv = hybrid(7, 2);
    assert_eq!(kv.allocate(A, &PrefixHit::default(), 8), Ok(0));
    assert_eq!(kv.num_free_blocks(), 1);
    // One more block per group needs 3; only 1 is free, and nothing changes.
    let err = kv.grow(A, 9).unwrap_err();
    assert_eq!((err.needed, err.free), (3, 1));
    for g in 0..3 {
        assert_eq!(kv.group_table(A, g).map(<[u32]>::len), Some(2));
    }
    // Admission counts every group as well.
    assert!(kv.allocate(B, &PrefixHit::default(), 1).is_err());
    assert!(!kv.has_table(B));
    kv.check_invariants().unwrap();
}

#[test]
fn a_prefix_hit_needs_only_the_window_blocks_of_sliding_groups() {
    let mut kv = hybrid(64, 1);
    let prompt: Vec<u32> = (0..24).collect();
    kv.allocate(A, &PrefixHit::default(), 24).unwrap();
    kv.commit_computed(A, &prompt, 24);
    kv.release_behind_window(A, 24);
    kv.free(A);
    // Every block of both groups stays cached after the free: a 21-token prompt with
    // the same 20 first tokens hits all 5 full blocks.
    let mut longer = prompt[..20].to_vec();
    longer.push(99);
    let hit = kv.find_prefix(&longer);
    assert_eq!(hit.num_tokens(), 20);
    // Position 20 reads 13..=20: the sliding group needs blocks 3 and 4 only.
    assert_eq!(&hit.group_blocks(1)[..3], &[RELEASED_BLOCK; 3]);
    assert!(hit.group_blocks(1)[3..]
        .iter()
        .all(|b| *b != RELEASED_BLOCK));
    assert_eq!(kv.allocate(B, &hit, 21), Ok(20));
    let sliding = kv.group_table(B, 1).unwrap();
    assert_eq!(live(sliding), 3);
    assert_eq!(kv.group_table(B, 0).map(live), Some(6));
    kv.check_invariants().unwrap();
}

#[test]
fn an_evicted_window_block_shortens_the_hit_to_where_the_window_is_cached() {
    // One full and one sliding group of 14 blocks in all.
    let mut kv = hybrid(14, 1);
    let prompt: Vec<u32> = (0..24).collect();
    kv.allocate(A, &PrefixHit::default(), 24).unwrap();
    kv.commit_computed(A, &prompt, 24);
    kv.release_behind_window(A, 24);
    kv.free(A);
    // The free queue now holds, evicted first: the 2 never-used blocks, the sliding
    // group's blocks 0..4 (released at position 24), the full group's 5..0 (freed tail
    // first), the sliding group's 5, 4. Another sequence of 4 blocks per group takes 8:
    // the sliding group's 0..4 and the full group's 5 and 4 go.
    assert_eq!(kv.allocate(B, &PrefixHit::default(), 16), Ok(0));
    // The full group still has blocks 0..4 (16 tokens), but a hit at 16 needs the
    // sliding group's blocks 2 and 3, at 12 blocks 1 and 2, and so on down: no hit,
    // although the sliding group still caches its blocks 4 and 5.
    assert_eq!(kv.find_prefix(&prompt).num_tokens(), 0);
    // Without the sliding group the full group alone would have hit 16 tokens.
    let mut full_only = KvCacheManager::new(14, 4, true);
    full_only.allocate(A, &PrefixHit::default(), 24).unwrap();
    full_only.commit_computed(A, &prompt, 24);
    full_only.free(A);
    assert_eq!(full_only.find_prefix(&prompt).num_tokens(), 20);
    kv.check_invariants().unwrap();
}

#[test]
fn fork_shares_every_group_or_nothing() {
    let mut kv = hybrid(64, 2);
    let prompt: Vec<u32> = (0..8).collect();
    kv.allocate(A, &PrefixHit::default(), 8).unwrap();
    kv.commit_computed(A, &prompt, 8);
    assert_eq!(kv.fork(A, B, 8), Some(8));
    for g in 0..3 {
        let (a, b) = (kv.group_table(A, g).unwrap(), kv.group_table(B, g).unwrap());
        assert_eq!(a, b);
        assert!(b.iter().all(|x| kv.ref_count(*x) == 2));
    }
    kv.check_invariants().unwrap();
    // A parent whose sliding groups released blocks the child still reads shares none.
    let long: Vec<u32> = (0..20).collect();
    let c = SeqId(3);
    kv.allocate(c, &PrefixHit::default(), 20).unwrap();
    kv.commit_computed(c, &long, 20);
    kv.release_behind_window(c, 20);
    assert_eq!(kv.fork(c, SeqId(4), 8), Some(0));
    kv.check_invariants().unwrap();
    for s in [A, B, c, SeqId(4)] {
        kv.free(s);
    }
    assert_eq!(kv.num_used_blocks(), 0);
}

#[test]
fn a_preempted_sequence_gives_back_every_group_and_resumes_from_the_cache() {
    let mut kv = hybrid(64, 2);
    let prompt: Vec<u32> = (0..13).collect();
    kv.allocate(A, &PrefixHit::default(), 13).unwrap();
    kv.commit_computed(A, &prompt, 13);
    kv.release_behind_window(A, 13);
    // Preemption frees every group's blocks.
    assert!(kv.free(A));
    assert_eq!(kv.num_used_blocks(), 0);
    // Recomputing finds all 3 full blocks in the full group and the window of position
    // 12 (5..=12: blocks 1 and 2) in both sliding groups.
    let hit = kv.find_prefix(&prompt);
    assert_eq!(hit.num_tokens(), 12);
    assert_eq!(kv.allocate(A, &hit, 13), Ok(12));
    assert_eq!(kv.group_table(A, 0).map(live), Some(4));
    assert_eq!(kv.group_table(A, 2).map(live), Some(3));
    kv.check_invariants().unwrap();
    kv.free(A);
    assert_eq!(kv.num_used_blocks(), 0);
}

#[test]
fn groups_never_share_blocks_with_each_other() {
    let mut kv = hybrid(64, 2);
    let prompt: Vec<u32> = (0..9).collect();
    kv.allocate(A, &PrefixHit::default(), 9).unwrap();
    kv.commit_computed(A, &prompt, 9);
    let hit = kv.find_prefix(&prompt);
    assert_eq!(hit.num_tokens(), 8);
    let mut seen = std::collections::HashSet::new();
    for g in 0..3 {
        for b in hit.group_blocks(g) {
            assert!(
                *b == RELEASED_BLOCK || seen.insert(*b),
                "block {b} in two groups"
            );
        }
    }
}
