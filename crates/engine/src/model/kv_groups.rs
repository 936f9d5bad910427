//! How the layers of a model share the KV cache's slot tensors (vLLM's hybrid KV cache
//! manager).
//!
//! Layers are grouped by attention kind (full, sliding window) into groups of `G` layer
//! slots, `G` the smaller kind's layer count; a kind that `G` does not divide gets a last
//! partial group. The cache holds `G` slot tensors (K and V) of `num_blocks` blocks each,
//! and layer `l` uses slot "index of `l` in its group" addressed through its group's
//! block table. A block id therefore means "these `G` layer slots for `block_size`
//! tokens", and a sliding group frees blocks behind its window while the full groups
//! keep theirs. With no sliding layer, or only sliding ones, there is one group and
//! layer `l` uses slot `l`: today's layout.
//!
//! Released table entries ([`tessera_protocol::RELEASED_BLOCK`]) are never read: CPU
//! ranks' attention starts at the window, and CUDA ranks' reads no key before the window
//! of a tile's first token.

use std::ops::Range;

use tessera_protocol::{KvCacheShape, KvGroups};

use crate::spec::model::ModelConfig;

/// Where one layer's KV lives: its group's block table, and its slot tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSlot {
    pub group: usize,
    pub slot: usize,
}

/// The grouping of every decoder layer of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGrouping {
    /// Per decoder layer of the model.
    pub of_layer: Vec<LayerSlot>,
    /// Full groups (`0..full`) and sliding groups after them; `None`: one group.
    pub hybrid: Option<KvGroups>,
    /// The sliding layers' window (with one group, only when every layer slides).
    pub window: Option<usize>,
}

impl KvGrouping {
    /// The grouping of `config`'s layers; hybrid only when `hybrid` allows it and the
    /// model mixes full and sliding layers.
    pub fn of_model(config: &ModelConfig, hybrid: bool) -> Self {
        let n = config.num_layers;
        let one_group = |window| KvGrouping {
            of_layer: (0..n).map(|slot| LayerSlot { group: 0, slot }).collect(),
            hybrid: None,
            window,
        };
        let Some(sw) = config.sliding_window.as_ref() else {
            return one_group(None);
        };
        let sliding = sw.layers.iter().filter(|s| **s).count();
        let full = n - sliding;
        if sliding == n && sw.layers.len() == n {
            return one_group(Some(sw.window));
        }
        if !hybrid || sliding == 0 || full == 0 {
            return one_group(None);
        }
        let g = full.min(sliding);
        let full_groups = full.div_ceil(g);
        let (mut seen_full, mut seen_sliding) = (0, 0);
        let of_layer = (0..n)
            .map(|l| {
                let (index, first_group) = match sw.layers.get(l).copied().unwrap_or(false) {
                    true => {
                        seen_sliding += 1;
                        (seen_sliding - 1, full_groups)
                    }
                    false => {
                        seen_full += 1;
                        (seen_full - 1, 0)
                    }
                };
                LayerSlot {
                    group: first_group + index / g,
                    slot: index % g,
                }
            })
            .collect();
        KvGrouping {
            of_layer,
            hybrid: Some(KvGroups {
                full: full_groups,
                sliding: sliding.div_ceil(g),
            }),
            window: Some(sw.window),
        }
    }

    /// Slot tensors the whole model needs: `G` when hybrid, every layer otherwise.
    pub fn num_slots(&self) -> usize {
        self.of_layer.iter().map(|s| s.slot + 1).max().unwrap_or(0)
    }

    /// The slots of the layers `layers` (a rank's): with one group renumbered from 0,
    /// as such a rank's cache holds its own layers only; hybrid, as they are.
    pub fn for_layers(&self, layers: Range<usize>) -> Vec<LayerSlot> {
        let start = layers.start;
        self.of_layer
            .get(layers)
            .unwrap_or(&[])
            .iter()
            .map(|s| match self.hybrid {
                Some(_) => *s,
                None => LayerSlot {
                    group: 0,
                    slot: s.slot - start,
                },
            })
            .collect()
    }

    /// The scheduler's view of a cache of `num_blocks` blocks with this grouping.
    pub fn shape(&self, num_blocks: usize, block_size: usize) -> KvCacheShape {
        KvCacheShape {
            attention_window: self.window,
            hybrid: self.hybrid,
            ..KvCacheShape::new(num_blocks, block_size)
        }
    }

    /// A line for the start-up log.
    pub fn describe(&self) -> Option<String> {
        let h = self.hybrid?;
        Some(format!(
            "hybrid KV cache: {} full-attention group(s) and {} sliding group(s) (window {}) \
             of {} layer slots each; a block holds {} layers' KV",
            h.full,
            h.sliding,
            self.window.unwrap_or(0),
            self.num_slots(),
            self.num_slots()
        ))
    }
}

/// Slots the layers `slots` use: the number of slot tensors a rank holds.
pub fn slots_needed(slots: &[LayerSlot]) -> usize {
    slots.iter().map(|s| s.slot + 1).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::model::SlidingWindow;

    fn config(pattern: &[bool]) -> ModelConfig {
        ModelConfig {
            num_layers: pattern.len(),
            sliding_window: Some(SlidingWindow {
                window: 512,
                layers: pattern.to_vec(),
                rope_theta: 10_000.0,
                rope_scaling: Default::default(),
            }),
            ..ModelConfig::default()
        }
    }

    #[test]
    fn gemma3_270m_gets_one_full_group_and_five_sliding_groups_of_three() {
        // Five sliding layers, then a full one, three times.
        let pattern: Vec<bool> = (0..18).map(|l| l % 6 != 5).collect();
        let g = KvGrouping::of_model(&config(&pattern), true);
        assert_eq!(
            g.hybrid,
            Some(KvGroups {
                full: 1,
                sliding: 5
            })
        );
        assert_eq!(g.num_slots(), 3);
        assert_eq!(g.of_layer[5], LayerSlot { group: 0, slot: 0 });
        assert_eq!(g.of_layer[17], LayerSlot { group: 0, slot: 2 });
        assert_eq!(g.of_layer[0], LayerSlot { group: 1, slot: 0 });
        // Sliding layers 0..4, 6..10, 12..16 in order, three to a group.
        assert_eq!(g.of_layer[6], LayerSlot { group: 2, slot: 2 });
        assert_eq!(g.of_layer[16], LayerSlot { group: 5, slot: 2 });
        // No two layers share a (group, slot).
        let mut pairs: Vec<_> = g.of_layer.iter().map(|s| (s.group, s.slot)).collect();
        pairs.sort_unstable();
        pairs.dedup();
        assert_eq!(pairs.len(), 18);
    }

    #[test]
    fn an_uneven_kind_gets_a_last_partial_group() {
        // 2 full, 5 sliding: G = 2, sliding groups of 2, 2, 1.
        let pattern = [true, false, true, true, false, true, true];
        let g = KvGrouping::of_model(&config(&pattern), true);
        assert_eq!(
            g.hybrid,
            Some(KvGroups {
                full: 1,
                sliding: 3
            })
        );
        assert_eq!(g.of_layer[6], LayerSlot { group: 3, slot: 0 });
    }

    #[test]
    fn one_kind_or_the_flag_off_keeps_one_group() {
        let all = KvGrouping::of_model(&config(&[true; 4]), true);
        assert_eq!(
            (all.hybrid, all.window, all.num_slots()),
            (None, Some(512), 4)
        );
        let off = KvGrouping::of_model(&config(&[true, false, true, false]), false);
        assert_eq!((off.hybrid, off.window), (None, None));
        assert_eq!(off.for_layers(2..4)[1], LayerSlot { group: 0, slot: 1 });
        let none = KvGrouping::of_model(&ModelConfig::default(), true);
        assert_eq!(none.hybrid, None);
    }
}
