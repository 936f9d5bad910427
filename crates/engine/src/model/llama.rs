//! The llama family (Llama, Mistral, SmolLM2, Qwen2, Qwen3, Gemma 3) as one
//! tensor-parallel shard.
//!
//! Per layer: RMSNorm → fused QKV (column-parallel) → (Qwen3, Gemma 3: RMSNorm of each
//! query and key head) → RoPE → paged attention over this
//! rank's heads → o_proj (row-parallel) → all-reduce → residual; RMSNorm → fused gate/up
//! (column-parallel) → SiLU·up → down (row-parallel) → all-reduce → residual. The
//! embedding is mirrored (a lookup is cheaper than any collective); the LM head is split
//! by vocabulary and its logits are gathered. Gemma 3 adds an RMSNorm after attention
//! and after the MLP (on the all-reduced sums, before each residual add), scaled
//! embeddings, a GELU MLP, and sliding-window layers with their own RoPE base. Qwen3-MoE
//! replaces the MLP of its sparse layers by a mixture of experts ([`crate::model::moe`]),
//! joined by the same single all-reduce.

use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use crate::config::layer_name;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::loader::blocks::down_block;
use crate::loader::matrix::Matrix;
use crate::loader::source::{vector_of_len, Embedding, TensorSource};
use crate::model::batch::Batch;
use crate::model::cpu_ops;
use crate::model::kv_cache::{CacheShape, KvCache, RankCache};
use crate::model::linear::{row_parallel, ColumnParallel, Linear};
use crate::model::linear_weight::LinearWeight;
use crate::model::moe::{self, MoeShard};
use crate::model::paged_attention::{attend, query_groups, write_kv, AttentionShape, QueryGroup};
use crate::model::rope::RopeTable;
use crate::tp::{Communicator, RankShard, ShardPlan};

use super::head_norms::{norm_across_heads, HeadNorms};

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
#[path = "llama_cuda.rs"]
mod cuda;

#[derive(Debug)]
struct Block {
    /// The attention half's input norm (`None`: OLMo 2 normalizes outputs only).
    attn_norm: Option<Tensor>,
    qkv: ColumnParallel,
    /// RMSNorm weights of queries and keys, where the model has them: per head
    /// (`head_dim` each, the same on every rank), or across all heads (OLMo 2: this
    /// rank's slice of them).
    qk_norm: Option<HeadNorms>,
    /// Gemma's norms of the attention and MLP outputs.
    post_attn_norm: Option<Tensor>,
    post_ffn_norm: Option<Tensor>,
    /// A sliding-window layer (attends to the model's window, rotates with its own base).
    sliding: bool,
    /// Queries and keys are rotated (false in SmolLM3's layers without RoPE).
    rotates: bool,
    /// gpt-oss's sink logit of each of this rank's query heads.
    sinks: Option<Vec<f32>>,
    /// Row-parallel; a bias (gpt-oss) is added by the first rank only, so the all-reduce
    /// counts it once.
    o_proj: Linear,
    /// The MLP half's input norm (`None` for OLMo 2).
    ffn_norm: Option<Tensor>,
    mlp: Mlp,
}

/// The MLP half of a layer.
#[derive(Debug)]
enum Mlp {
    Dense {
        gate_up: ColumnParallel,
        down: Linear,
    },
    Experts(MoeShard),
}

/// One rank's part of the model. Owned by that rank's worker thread.
#[derive(Debug)]
pub struct LlamaShard {
    config: ModelConfig,
    shard: RankShard,
    embedding: Embedding,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    rope: Arc<RopeTable>,
    /// RoPE of the sliding-window layers, where they have their own base.
    rope_sliding: Option<Arc<RopeTable>>,
    query_groups: Vec<QueryGroup>,
    device: Device,
    /// The RoPE tables and launch facts of a CUDA rank.
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    gpu: Option<cuda::GpuParts>,
}

/// Loads every rank's shard of the decoder `layers`, reading each tensor once.
pub fn load_shards(
    source: &dyn TensorSource,
    plan: &ShardPlan,
    devices: &[Device],
    layers: std::ops::Range<usize>,
) -> Result<Vec<LlamaShard>> {
    load_rank_shards(source, plan, 0..plan.world_size, devices, layers)
}

/// Loads the shards of the plan's ranks `ranks` only (one device each): a node of a
/// group of nodes holds a slice of the group's ranks.
pub fn load_rank_shards(
    source: &dyn TensorSource,
    plan: &ShardPlan,
    ranks: std::ops::Range<usize>,
    devices: &[Device],
    layers: std::ops::Range<usize>,
) -> Result<Vec<LlamaShard>> {
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
    let expert_ranges = match &config.moe {
        Some(m) => {
            let mut block = 1;
            for layer in layers.clone().filter(|l| config.is_moe_layer(*l)) {
                block = block.max(down_block(source, m, layer)?);
            }
            Some(moe::expert_split(m, plan, block)?)
        }
        None => None,
    };
    let mut bytes_read = 0usize;
    for layer in layers.clone() {
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
            (Some(m), Some(ranges)) if config.is_moe_layer(layer) => {
                moe::load_shards(source, m, layer, ranges, ranks.start, devices)?
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
        if (layer + 1) % 10 == 0 || layer + 1 == layers.end {
            tracing::info!(
                "loaded layer {}/{}: {:.1} MiB of weights in {:.2}s",
                layer + 1,
                layers.end,
                bytes_read as f64 / (1 << 20) as f64,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let norm = norm_weight("model.norm.weight")?;
    let head_name = if source.contains("lm_head.weight") && !config.tie_word_embeddings {
        "lm_head.weight"
    } else {
        "model.embed_tokens.weight"
    };
    let head = source.matrix(head_name)?;
    head.check_dims((config.vocab_size, h))?;
    let head_split = plan.lm_head();
    let mut shards = Vec::with_capacity(devices.len());
    for (i, (blocks, dev)) in per_rank_blocks.into_iter().zip(devices).enumerate() {
        let rank = ranks.start + i;
        let head_rows = head_split.rank_ranges(rank).unwrap_or_default();
        let shard = plan.ranks[rank].clone();
        let kv_of_q = shard.local_kv_of_q(config.group_size());
        #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
        let gpu = if dev.is_cuda() {
            Some(cuda::GpuParts::new(
                dev,
                &config,
                (&rope, rope_sliding.as_deref()),
                &kv_of_q,
                &blocks,
            )?)
        } else {
            None
        };
        shards.push(LlamaShard {
            query_groups: query_groups(&kv_of_q),
            config: config.clone(),
            shard,
            embedding: embedding.to_device(dev)?,
            blocks,
            norm: norm.to_device(dev)?,
            lm_head: Linear::new(
                LinearWeight::place(head.select_rows(&head_rows)?, dev)?,
                None,
            ),
            rope: rope.clone(),
            rope_sliding: rope_sliding.clone(),
            device: dev.clone(),
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            gpu,
        });
    }
    Ok(shards)
}

impl LlamaShard {
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether this shard runs the CUDA ranks' forward pass (its KV cache, our kernels).
    pub fn runs_gpu_path(&self) -> bool {
        #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
        return self.gpu.is_some();
        #[cfg(not(any(feature = "cuda", feature = "gpu-emulation")))]
        false
    }

    /// Test builds: this host shard takes the CUDA ranks' forward pass, our CUDA kernels
    /// emulated (its weights stay as loaded for the host; each matmul reads its input in
    /// their type).
    #[cfg(feature = "gpu-emulation")]
    pub(crate) fn take_gpu_path(&mut self) -> Result<()> {
        let kv_of_q = self.shard.local_kv_of_q(self.config.group_size());
        self.gpu = Some(cuda::GpuParts::new(
            &self.device,
            &self.config,
            (&self.rope, self.rope_sliding.as_deref()),
            &kv_of_q,
            &self.blocks,
        )?);
        for block in &mut self.blocks {
            if let Some(norms) = &mut block.qk_norm {
                norms.on_device = Some(norms.tensors(&self.device)?);
            }
        }
        Ok(())
    }

    /// The KV cache this shard's layers read and write.
    pub fn cache_shape(&self) -> CacheShape {
        CacheShape {
            layers: self.num_layers(),
            kv_heads: self.num_local_kv_heads(),
            head_dim: self.head_dim(),
            gpu_path: self.runs_gpu_path(),
            device: self.device.clone(),
        }
    }

    pub fn num_local_kv_heads(&self) -> usize {
        self.shard.kv_heads.len()
    }

    /// Decoder layers this shard runs.
    pub fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    pub fn head_dim(&self) -> usize {
        self.config.head_dim
    }

    /// Token embeddings of the batch, `[tokens, hidden]`.
    pub fn embed(&self, batch: &Batch) -> Result<Tensor> {
        let ids = Tensor::from_slice(&batch.token_ids, batch.num_tokens(), &self.device)?;
        let x = self.embedding.forward(&ids)?.to_dtype(DType::F32)?;
        Ok(match self.config.embed_scale {
            Some(scale) => (x * f64::from(scale))?,
            None => x,
        })
    }

    /// This shard's decoder layers over the hidden states `x`, with the rank's KV cache.
    pub fn layers(
        &self,
        x: Tensor,
        batch: &Batch,
        cache: &mut RankCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        match cache {
            RankCache::Cpu(cache) => self.layers_cpu(x, batch, cache, comm),
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            RankCache::Cuda(cache) => self.layers_cuda(x, batch, cache, comm),
        }
    }

    /// The decoder layers on CPU: our SIMD kernels over host buffers.
    fn layers_cpu(
        &self,
        mut x: Tensor,
        batch: &Batch,
        cache: &mut KvCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        let n = batch.num_tokens();
        let eps = self.config.rms_norm_eps as f32;
        let hd = self.config.head_dim;
        let nq = self.shard.q_heads.len();
        let nkv = self.shard.kv_heads.len();
        let full = AttentionShape {
            num_q_heads: nq,
            head_dim: hd,
            groups: &self.query_groups,
            scale: self
                .config
                .attention_scale
                .unwrap_or(1.0 / (hd as f32).sqrt()),
            window: None,
            softcap: self.config.attn_logit_softcapping,
            sinks: None,
        };
        let sliding = AttentionShape {
            window: self.config.sliding_window.as_ref().map(|sw| sw.window),
            ..full
        };
        let mut layers = std::mem::take(&mut cache.layers);
        let result = (|| -> Result<Tensor> {
            for (block, layer_cache) in self.blocks.iter().zip(layers.iter_mut()) {
                let h = match &block.attn_norm {
                    Some(w) => cpu_ops::rms_norm(&x, w, eps)?,
                    None => x.clone(),
                };
                let [mut q, mut k, v]: [Vec<f32>; 3] =
                    block.qkv.forward_vecs(&h)?.try_into().map_err(|_| {
                        EngineError::Parallel("qkv: expected three segments".into())
                    })?;
                match &block.qk_norm {
                    Some(
                        norms @ HeadNorms {
                            across: Some(a), ..
                        },
                    ) => norm_across_heads(&mut q, &mut k, n, norms, a, comm, eps)?,
                    Some(norms) => {
                        cpu_ops::rms_norm_heads(&mut q, &norms.q, eps);
                        cpu_ops::rms_norm_heads(&mut k, &norms.k, eps);
                    }
                    None => {}
                }
                let (rope, shape) = match (&self.rope_sliding, block.sliding) {
                    (Some(r), true) => (r, sliding),
                    _ => (&self.rope, full),
                };
                let shape = AttentionShape {
                    sinks: block.sinks.as_deref(),
                    ..shape
                };
                if block.rotates {
                    for (t, &pos) in batch.positions.iter().enumerate() {
                        rope.apply(&mut q[t * nq * hd..(t + 1) * nq * hd], pos);
                        rope.apply(&mut k[t * nkv * hd..(t + 1) * nkv * hd], pos);
                    }
                }
                write_kv(layer_cache, cache, batch, &k, &v);
                let attn = attend(layer_cache, cache, batch, &q, shape);
                let attn = Tensor::from_vec(attn, (n, nq * hd), &self.device)?;
                let mut o = comm.all_reduce_sum(&block.o_proj.forward(&attn)?)?;
                if let Some(w) = &block.post_attn_norm {
                    o = cpu_ops::rms_norm(&o, w, eps)?;
                }
                x = cpu_ops::add(&x, &self.to_residual(o)?)?;
                let h = match &block.ffn_norm {
                    Some(w) => cpu_ops::rms_norm(&x, w, eps)?,
                    None => x.clone(),
                };
                let partial = match &block.mlp {
                    Mlp::Dense { gate_up, down } => {
                        down.forward(&gate_up.forward_gated(&h, self.config.activation)?)?
                    }
                    Mlp::Experts(experts) => experts.forward(&h)?,
                };
                let mut d = comm.all_reduce_sum(&partial)?;
                if let Some(w) = &block.post_ffn_norm {
                    d = cpu_ops::rms_norm(&d, w, eps)?;
                }
                x = cpu_ops::add(&x, &self.to_residual(d)?)?;
            }
            Ok(x)
        })();
        cache.layers = layers;
        result
    }

    /// Final norm and LM head over the sampled rows of `x`: logits `[rows, vocab]`.
    pub fn head(&self, x: &Tensor, batch: &Batch, comm: &mut dyn Communicator) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps as f32;
        if batch.sample_rows.is_empty() {
            return Ok(Tensor::zeros(
                (0, self.config.vocab_size),
                DType::F32,
                &self.device,
            )?);
        }
        if self.runs_gpu_path() {
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            return self.head_cuda(x, batch, comm);
        }
        let rows: Vec<u32> = batch.sample_rows.iter().map(|r| *r as u32).collect();
        let rows = Tensor::from_slice(&rows, rows.len(), &self.device)?;
        let last = x.index_select(&rows, 0)?;
        let last = cpu_ops::rms_norm(&last, &self.norm, eps)?;
        let logits = final_logits(self.lm_head.forward(&last)?, &self.config)?;
        comm.all_gather(&logits, 1)
    }

    /// A layer half's output as it joins the residual stream: times Granite's residual
    /// multiplier, where the model has one.
    pub(crate) fn to_residual(&self, out: Tensor) -> Result<Tensor> {
        Ok(match self.config.residual_multiplier {
            Some(m) if m != 1.0 => (out * f64::from(m))?,
            _ => out,
        })
    }
}

/// The LM head's logits as the model ends: divided by Granite's logits scaling, and
/// capped to Gemma 2's `cap · tanh(logit / cap)`, on this rank's slice of the vocabulary
/// (element by element, so before the gather as after it).
pub(crate) fn final_logits(mut logits: Tensor, config: &ModelConfig) -> Result<Tensor> {
    if let Some(s) = config.logits_scaling.filter(|s| *s != 1.0) {
        logits = (logits / f64::from(s))?;
    }
    Ok(match config.final_logit_softcapping {
        Some(cap) => ((logits / f64::from(cap))?.tanh()? * f64::from(cap))?,
        None => logits,
    })
}
