//! Loading the decoder's shards: each tensor read once from the source and cut for every
//! rank of the plan (column-parallel, row-parallel, mirrored), placed on each rank's
//! device.

use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
use super::gpu_parts::GpuParts;
use super::mtp;
use super::shard::{Block, DecoderShard, Mlp};
use crate::error::{EngineError, Result};
use crate::loader::blocks::down_block;
use crate::loader::matrix::Matrix;
use crate::loader::source::{lm_head_name, vector_of_len, TensorSource};
use crate::model::head_norms::HeadNorms;
use crate::model::kv_groups::LayerSlot;
use crate::model::linear::{row_parallel, ColumnParallel, Linear};
use crate::model::linear_weight::LinearWeight;
use crate::model::moe;
use crate::model::paged_attention::query_groups;
use crate::model::rope::RopeTable;
use crate::spec::tensor_names::layer_name;
use crate::tp::ShardPlan;

/// What a shard holds beside its layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardParts {
    /// The token embedding (the first pipeline stage, every tensor-parallel rank).
    pub embedding: bool,
    /// The final norm and LM head (the last stage, every rank).
    pub head: bool,
    /// The routed experts of layers `0..n` stay on the host (`--n-cpu-moe`).
    pub host_expert_layers: usize,
    /// The multi-token-prediction layer after the decoder layers (`mtp` speculation;
    /// tensor parallelism only).
    pub mtp: bool,
}

impl ShardParts {
    /// Embedding and head, every expert with its layer.
    pub const WHOLE: ShardParts = ShardParts {
        embedding: true,
        head: true,
        host_expert_layers: 0,
        mtp: false,
    };
}

/// Loads every rank's shard of the decoder `layers`, reading each tensor once.
pub fn load_shards(
    source: &dyn TensorSource,
    plan: &ShardPlan,
    devices: &[Device],
    layers: std::ops::Range<usize>,
    parts: &ShardParts,
) -> Result<Vec<DecoderShard>> {
    load_rank_shards(source, plan, 0..plan.world_size, devices, layers, parts)
}

/// Loads the shards of the plan's ranks `ranks` only (one device each): a node of a
/// group of nodes holds a slice of the group's ranks.
pub fn load_rank_shards(
    source: &dyn TensorSource,
    plan: &ShardPlan,
    ranks: std::ops::Range<usize>,
    devices: &[Device],
    layers: std::ops::Range<usize>,
    parts: &ShardParts,
) -> Result<Vec<DecoderShard>> {
    let config = source.config().clone();
    let world = plan.world_size;
    if devices.len() != ranks.len() || ranks.end > world {
        return Err(EngineError::Parallel(format!(
            "{} devices for ranks {ranks:?} of {world}",
            devices.len()
        )));
    }
    let (h, hd) = (config.hidden_size, config.head_dim);
    if devices.iter().any(Device::is_cuda) {
        tessera_kernels::gpu::launch::check_head_dim(hd).map_err(EngineError::Config)?;
    }
    let started = Instant::now();
    let embedding = source.embedding()?;
    let (vocab, emb_h) = embedding.dims()?;
    if (vocab, emb_h) != (config.vocab_size, h) {
        return Err(EngineError::ShapeMismatch {
            name: "model.embed_tokens.weight".into(),
            expected: vec![config.vocab_size, h],
            found: vec![vocab, emb_h],
        });
    }
    let rope = Arc::new(RopeTable::scaled(
        (hd, config.rotary_dim),
        config.rope_theta,
        &config.rope_scaling,
        config.max_position_embeddings,
        config.rope_style,
    ));
    let rope_sliding = config.sliding_window.as_ref().map(|sw| {
        Arc::new(RopeTable::scaled(
            (hd, config.rotary_dim),
            sw.rope_theta,
            &sw.rope_scaling,
            config.max_position_embeddings,
            config.rope_style,
        ))
    });
    // An RMSNorm weight as the forward pass applies it (gemma stores it less 1).
    let offset = f64::from(config.norm_weight_offset);
    let norm_weight = |name: &str| -> Result<Tensor> {
        let v = source.vector(name)?.to_dtype(DType::F32)?;
        Ok(if offset == 0.0 { v } else { (v + offset)? })
    };
    let mut per_rank_blocks: Vec<Vec<Block>> = (0..devices.len())
        .map(|_| Vec::with_capacity(layers.len()))
        .collect();
    let (qkv_split, o_split, gu_split, down_split) =
        (plan.qkv(), plan.o_proj(), plan.gate_up(), plan.down());
    if layers.end > config.num_layers || layers.is_empty() {
        return Err(EngineError::Parallel(format!(
            "layers {layers:?} do not fit a model of {} layers",
            config.num_layers
        )));
    }
    // The MTP layer, after the decoder layers, is loaded with them and set apart after.
    let mtp_layer = match parts.mtp {
        true => Some(mtp_layer_index(source, &config, &layers, parts)?),
        false => None,
    };
    // The MTP layer has the last decoder layer's kind of MLP (GLM-4.5: a mixture).
    let is_moe_layer = |l: usize| match Some(l) == mtp_layer {
        true => config.is_moe_layer(config.num_layers - 1),
        false => config.is_moe_layer(l),
    };
    let expert_ranges = match &config.moe {
        Some(m) => {
            let mut block = 1;
            for layer in layers.clone().chain(mtp_layer).filter(|l| is_moe_layer(*l)) {
                block = block.max(down_block(source, m, layer)?);
            }
            Some(moe::expert_split(m, plan, block)?)
        }
        None => None,
    };
    let mut bytes_read = 0usize;
    for layer in layers.clone().chain(mtp_layer) {
        let name = |s: &str| layer_name(layer, s);
        let mat = |s: &str, dims: (usize, usize)| -> Result<Matrix> {
            let m = source.matrix(&name(s))?;
            m.check_dims(dims)?;
            Ok(m)
        };
        let qkv = [
            mat("self_attn.q_proj.weight", (config.num_heads * hd, h))?,
            mat("self_attn.k_proj.weight", (config.num_kv_heads * hd, h))?,
            mat("self_attn.v_proj.weight", (config.num_kv_heads * hd, h))?,
        ];
        let qkv_bias = if config.attention_bias {
            Some([
                source.vector(&name("self_attn.q_proj.bias"))?,
                source.vector(&name("self_attn.k_proj.bias"))?,
                source.vector(&name("self_attn.v_proj.bias"))?,
            ])
        } else {
            None
        };
        let o = mat("self_attn.o_proj.weight", (h, config.num_heads * hd))?;
        let o_bias = config
            .attention_out_bias
            .then(|| source.vector(&name("self_attn.o_proj.bias")))
            .transpose()?;
        let sinks = config
            .attention_sinks
            .then(|| vector_of_len(source, &name("self_attn.sinks"), config.num_heads))
            .transpose()?
            .map(|v| v.to_vec1::<f32>())
            .transpose()?;
        bytes_read += qkv
            .iter()
            .chain([&o])
            .map(Matrix::size_bytes)
            .sum::<usize>();
        // Per rank: the dense MLP, or its slice of every expert.
        let mut mlps: Vec<Mlp> = match (&config.moe, &expert_ranges) {
            (Some(m), Some(ranges)) if is_moe_layer(layer) => {
                let host = layer < parts.host_expert_layers;
                moe::load_shards(source, m, layer, ranges, ranks.start, devices, host)?
                    .into_iter()
                    .map(Mlp::Experts)
                    .collect()
            }
            _ => {
                let gate_up = [
                    mat("mlp.gate_proj.weight", (config.intermediate_size, h))?,
                    mat("mlp.up_proj.weight", (config.intermediate_size, h))?,
                ];
                let down = mat("mlp.down_proj.weight", (h, config.intermediate_size))?;
                bytes_read += gate_up
                    .iter()
                    .chain([&down])
                    .map(Matrix::size_bytes)
                    .sum::<usize>();
                devices
                    .iter()
                    .enumerate()
                    .map(|(i, dev)| {
                        let rank = ranks.start + i;
                        Ok(Mlp::Dense {
                            gate_up: ColumnParallel::load(
                                &gate_up, None, &gu_split, rank, dev, "gate_up",
                            )?,
                            down: row_parallel(&down, &down_split, rank, dev)?,
                        })
                    })
                    .collect::<Result<_>>()?
            }
        };
        mlps.reverse();
        let qk_norm = if config.qk_norm {
            // Per head, or (OLMo 2) across all query heads and all KV heads.
            let (q_len, k_len) = match config.qk_norm_across_heads {
                true => (config.num_heads * hd, config.num_kv_heads * hd),
                false => (hd, hd),
            };
            let norm = |s: &str, len: usize| -> Result<Vec<f32>> {
                let v = norm_weight(&name(s))?;
                if v.dims1()? != len {
                    return Err(EngineError::ShapeMismatch {
                        name: name(s),
                        expected: vec![len],
                        found: v.dims().to_vec(),
                    });
                }
                Ok(v.to_dtype(DType::F32)?.to_vec1::<f32>()?)
            };
            Some(HeadNorms {
                q: norm("self_attn.q_norm.weight", q_len)?,
                k: norm("self_attn.k_norm.weight", k_len)?,
                across: None,
                on_device: None,
            })
        } else {
            None
        };
        let input_norm = |s: &str| -> Result<Option<Tensor>> {
            config
                .input_norms
                .then(|| norm_weight(&name(s)))
                .transpose()
        };
        let attn_norm = input_norm("input_layernorm.weight")?;
        let (ffn_norm, post_attn_norm, post_ffn_norm) = if config.sandwich_norms {
            let [ffn, post_attn, post_ffn] = config.sandwich_norm_names();
            (
                input_norm(ffn)?,
                Some(norm_weight(&name(post_attn))?),
                Some(norm_weight(&name(post_ffn))?),
            )
        } else {
            (input_norm("post_attention_layernorm.weight")?, None, None)
        };
        let sliding = config
            .sliding_window
            .as_ref()
            .is_some_and(|sw| sw.layers.get(layer).copied().unwrap_or(false));
        for (i, dev) in devices.iter().enumerate() {
            let rank = ranks.start + i;
            let mlp = mlps.pop().ok_or_else(|| {
                EngineError::Parallel(format!("layer {layer}: no MLP for rank {rank}"))
            })?;
            per_rank_blocks[i].push(Block {
                attn_norm: attn_norm.as_ref().map(|n| n.to_device(dev)).transpose()?,
                qkv: ColumnParallel::load(
                    &qkv,
                    qkv_bias.as_ref().map(|b| &b[..]),
                    &qkv_split,
                    rank,
                    dev,
                    "qkv",
                )?,
                qk_norm: match (&qk_norm, config.qk_norm_across_heads) {
                    (Some(n), true) => {
                        Some(HeadNorms::across_heads(&n.q, &n.k, plan, rank, hd)?.for_device(dev)?)
                    }
                    (n, _) => n.as_ref().map(|n| n.for_device(dev)).transpose()?,
                },
                post_attn_norm: post_attn_norm
                    .as_ref()
                    .map(|n| n.to_device(dev))
                    .transpose()?,
                post_ffn_norm: post_ffn_norm
                    .as_ref()
                    .map(|n| n.to_device(dev))
                    .transpose()?,
                sliding,
                rotates: !config.nope_layers.get(layer).copied().unwrap_or(false),
                sinks: sinks
                    .as_ref()
                    .map(|s| s[plan.ranks[rank].q_heads.clone()].to_vec()),
                o_proj: row_parallel(&o, &o_split, rank, dev)?
                    .with_bias(o_bias.as_ref().filter(|_| rank == 0), dev)?,
                ffn_norm: ffn_norm.as_ref().map(|n| n.to_device(dev)).transpose()?,
                mlp,
            });
        }
        if Some(layer) == mtp_layer {
            tracing::info!(
                "loaded the multi-token-prediction layer ({}) in {:.2}s",
                layer_name(layer, "*"),
                started.elapsed().as_secs_f64()
            );
        } else if (layer + 1) % 10 == 0 || layer + 1 == layers.end {
            tracing::info!(
                "loaded layer {}/{}: {:.1} MiB of weights in {:.2}s",
                layer + 1,
                layers.end,
                bytes_read as f64 / (1 << 20) as f64,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let mut mtp_parts = match mtp_layer {
        Some(layer) => {
            let blocks = per_rank_blocks
                .iter_mut()
                .map(|b| {
                    b.pop().ok_or_else(|| {
                        EngineError::Parallel("the MTP layer's block was not loaded".into())
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            mtp::load(source, plan, (ranks.clone(), devices), layer, blocks)?
        }
        None => Vec::new(),
    };
    mtp_parts.reverse();
    let norm = norm_weight("model.norm.weight")?;
    let head = match parts.head {
        true => {
            let head = source.matrix(lm_head_name(source))?;
            head.check_dims((config.vocab_size, h))?;
            Some(head)
        }
        false => None,
    };
    let head_split = plan.lm_head();
    let mut shards = Vec::with_capacity(devices.len());
    for (i, (blocks, dev)) in per_rank_blocks.into_iter().zip(devices).enumerate() {
        let rank = ranks.start + i;
        let head_rows = head_split.rank_ranges(rank).unwrap_or_default();
        let shard = plan.ranks[rank].clone();
        let kv_of_q = shard.local_kv_of_q(config.group_size());
        #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
        let gpu = if dev.is_cuda() {
            Some(GpuParts::new(
                dev,
                &config,
                (&rope, rope_sliding.as_deref()),
                &kv_of_q,
                blocks.iter().map(|b| b.sinks.as_deref()),
            )?)
        } else {
            None
        };
        shards.push(DecoderShard {
            kv_slots: (0..blocks.len())
                .map(|slot| LayerSlot { group: 0, slot })
                .collect(),
            query_groups: query_groups(&kv_of_q),
            config: config.clone(),
            shard,
            embedding: parts
                .embedding
                .then(|| embedding.to_device(dev))
                .transpose()?,
            blocks,
            mtp: mtp_parts.pop(),
            norm: norm.to_device(dev)?,
            lm_head: head
                .as_ref()
                .map(|head| -> Result<Linear> {
                    Ok(Linear::new(
                        LinearWeight::place(head.select_rows(&head_rows)?, dev)?,
                        None,
                    ))
                })
                .transpose()?,
            rope: rope.clone(),
            rope_sliding: rope_sliding.clone(),
            device: dev.clone(),
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            gpu,
        });
    }
    Ok(shards)
}

/// The MTP layer's index (`num_layers`), once the model and this load can have it: a
/// GLM-4.5 checkpoint that declares one and holds its weights, loaded whole by tensor
/// parallelism.
fn mtp_layer_index(
    source: &dyn TensorSource,
    config: &crate::spec::model::ModelConfig,
    layers: &std::ops::Range<usize>,
    parts: &ShardParts,
) -> Result<usize> {
    let layer = config.num_layers;
    let refuse = |m: String| Err(EngineError::Config(format!("mtp speculation: {m}")));
    match config.family.name {
        "glm4_moe" => {}
        "minimax_m2" => {
            return refuse(
                "MiniMax-M2's published checkpoints hold no weights for the MTP modules its \
                 config.json names (num_mtp_modules); use ngram or draft_model"
                    .into(),
            )
        }
        other => {
            return refuse(format!(
                "{other} models have no multi-token-prediction layer (GLM-4.5's do); use \
                 ngram or draft_model"
            ))
        }
    }
    if config.prediction_layers == 0 {
        return refuse(
            "the model's config declares no multi-token-prediction layer \
             (num_nextn_predict_layers 0)"
                .into(),
        );
    }
    let eh_proj = layer_name(layer, mtp::EH_PROJ);
    if !source.contains(&eh_proj) {
        return refuse(format!(
            "the checkpoint holds no weights for its multi-token-prediction layer ({eh_proj} \
             is missing; quantized copies often leave the layer out)"
        ));
    }
    if *layers != (0..config.num_layers) || !parts.embedding || !parts.head {
        return refuse(
            "the MTP layer runs with the whole model on each rank's group (tensor \
             parallelism), not across pipeline stages or nodes"
                .into(),
        );
    }
    if parts.host_expert_layers > layer {
        return refuse(
            "--n-cpu-moe covers the MTP layer's experts; give at most the decoder \
             layers' count"
                .into(),
        );
    }
    Ok(layer)
}
