//! Loading a target and its draft model, and sharing the KV memory between them.

use std::path::Path;

use tessera_protocol::Executor;

use super::Drafted;
use crate::config::EngineConfig;
use crate::device::DeviceMemory;
use crate::engine::Engine;
use crate::error::{EngineError, Result};

/// The draft's cache before it takes its share: room for a few blocks of any model, and
/// for the fp8 warm-up step.
const PROVISIONAL_DRAFT_KV_BYTES: usize = 64 << 20;

/// Loads the draft model on the first of `cfg`'s devices, then the target as `cfg`
/// says, and splits the target's KV memory between them: both caches get the same
/// number of blocks (a block id means the same positions in both), as many as the
/// target's cache memory holds at both models' bytes per block. The draft loads first
/// so that a GPU's KV sizing sees its weights as taken.
pub fn load_drafted(cfg: &EngineConfig, draft_path: &Path) -> Result<Drafted<Engine, Engine>> {
    if cfg.nodes.as_ref().is_some_and(|n| n.nnodes > 1) {
        return Err(EngineError::Config(
            "a draft model is not served by a group of nodes; use the ngram method".into(),
        ));
    }
    let Some(&first) = cfg.devices.first() else {
        return Err(EngineError::Config(
            "no device to run the draft model on".into(),
        ));
    };
    let started = std::time::Instant::now();
    tracing::info!("draft model {} on {first}", draft_path.display());
    let draft_cfg = EngineConfig {
        model_path: draft_path.to_path_buf(),
        devices: vec![first],
        tensor_split: None,
        device_layers: None,
        device_memory: DeviceMemory::default(),
        host_expert_layers: None,
        cpu_kv_sizing: None,
        gpu_memory_utilization: None,
        kv_cache_bytes: PROVISIONAL_DRAFT_KV_BYTES,
        nodes: None,
        // The draft reads the target's group-0 table, which covers every position.
        hybrid_kv_cache: false,
        // Both engines address the same blocks; graphs would take one of them.
        decode_graphs: false,
        ..cfg.clone()
    };
    let mut draft = Engine::load(&draft_cfg).map_err(|e| {
        EngineError::Config(format!(
            "loading the draft model {}: {e}",
            draft_path.display()
        ))
    })?;
    tracing::info!(
        "draft model loaded in {:.2}s",
        started.elapsed().as_secs_f64()
    );
    // The target's verification steps are not decode steps, and its blocks are the
    // draft's: it runs eagerly too.
    let target_cfg = EngineConfig {
        decode_graphs: false,
        ..cfg.clone()
    };
    let mut target = Engine::load(&target_cfg)?;
    let (target_kv, draft_kv) = (target.kv_cache_shape(), draft.kv_cache_shape());
    // When every layer of the target slides, blocks behind its window go back to the
    // pool: the draft must not read them, so it must attend to no more than that window.
    // (With hybrid groups, group 0 reads the whole context and keeps its blocks.)
    if let (Some(window), None) = (target_kv.attention_window, target_kv.hybrid) {
        if draft_kv.attention_window.is_none_or(|w| w > window) {
            return Err(EngineError::Config(format!(
                "the model's layers all attend to a window of {window} positions and its KV \
                 cache releases the blocks behind it, which the draft model {} would still \
                 read; use a draft with that window or a smaller one, or the ngram method",
                draft_path.display()
            )));
        }
    }
    let (target_bytes, draft_bytes) = (target.kv_block_bytes(), draft.kv_block_bytes());
    let num_blocks = shared_blocks(target_kv.num_blocks, target_bytes, draft_bytes);
    if num_blocks == 0 {
        return Err(EngineError::Config(
            "the KV cache holds no block for both the model and its draft; give it more memory"
                .into(),
        ));
    }
    target.resize_cache(num_blocks)?;
    draft.resize_cache(num_blocks)?;
    tracing::info!(
        "KV cache shared with the draft model: {num_blocks} blocks of {} tokens \
         ({target_bytes} + {draft_bytes} bytes per block; {} blocks without the draft)",
        target_kv.block_size_tokens,
        target_kv.num_blocks
    );
    let vocab_rows = target.model_config().vocab_size;
    Ok(Drafted::new(target, draft, vocab_rows))
}

/// Blocks of both caches that fit the memory of `blocks` target blocks.
fn shared_blocks(blocks: usize, target_bytes: usize, draft_bytes: usize) -> usize {
    let total = target_bytes.saturating_add(draft_bytes).max(1) as u128;
    (blocks as u128 * target_bytes as u128 / total) as usize
}

#[cfg(test)]
mod tests {
    use super::shared_blocks;

    #[test]
    fn both_caches_fit_the_targets_memory() {
        // A draft with a third of the target's bytes per block: 3/4 of the blocks.
        assert_eq!(shared_blocks(1000, 300, 100), 750);
        assert_eq!(shared_blocks(1000, 100, 100), 500);
        assert_eq!(shared_blocks(1, 100, 100), 0);
        assert!(shared_blocks(1000, 300, 100) * (300 + 100) <= 1000 * 300);
    }
}
