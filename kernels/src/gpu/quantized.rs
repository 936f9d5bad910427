//! The kernels of an 8-bit KV cache (int8 or fp8 E4M3, as [`crate::kv_quant`] defines
//! them): their names, launch shapes, and a plain host reference of what they store.
//!
//! A step's 8-bit write is two or three launches after RoPE has rotated the keys in place
//! (`rope_write_kv_*` with null cache pointers): for fp8, on a layer's first write only,
//! `kv_fp8_scales_*` sets the layer's per-head scales; then `kv_store_{int8,fp8}_*`
//! quantizes the step's keys and values into the cache. Attention reads the cache with
//! `paged_attention_{dtype}_{int8,fp8}_hd*_q*`, which take the K and V scales after the
//! cache pointers.

use super::launch::{KvDtype, LaunchShape};
use crate::kv_quant::{
    e4m3_from_f32, e4m3_to_f32, fp8_scale, int8_quantize, int8_requantize, Int8Run, KvCacheDtype,
    ScaleKind,
};

/// An 8-bit element type of a CUDA rank's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvQuant {
    /// int8, one scale per (block, KV head).
    Int8,
    /// fp8 E4M3, one scale per KV head of the layer.
    Fp8,
}

impl KvQuant {
    /// The 8-bit type a cache of `dtype` stores, if it is one.
    pub fn of(dtype: KvCacheDtype) -> Option<KvQuant> {
        match dtype {
            KvCacheDtype::Int8 => Some(KvQuant::Int8),
            KvCacheDtype::Fp8E4m3 => Some(KvQuant::Fp8),
            _ => None,
        }
    }

    pub fn dtype(self) -> KvCacheDtype {
        match self {
            KvQuant::Int8 => KvCacheDtype::Int8,
            KvQuant::Fp8 => KvCacheDtype::Fp8E4m3,
        }
    }

    pub fn suffix(self) -> &'static str {
        match self {
            KvQuant::Int8 => "int8",
            KvQuant::Fp8 => "fp8",
        }
    }

    /// Scales of one layer's K (and as many of its V) in a cache of `num_blocks` blocks.
    pub fn scales_len(self, num_blocks: usize, num_kv_heads: usize) -> usize {
        match self.dtype().scales() {
            ScaleKind::PerBlockHead => num_blocks * num_kv_heads,
            _ => num_kv_heads,
        }
    }
}

/// The cache types the kernels hold with activations of `dtype`: that type itself, or
/// one of the 8-bit types.
pub fn holds(dtype: KvDtype, stores: KvCacheDtype) -> bool {
    KvQuant::of(stores).is_some()
        || matches!(
            (dtype, stores),
            (KvDtype::Bf16, KvCacheDtype::Bf16) | (KvDtype::F16, KvCacheDtype::F16)
        )
}

/// The attention kernel over an 8-bit cache, for tiles of `tile` tokens.
pub fn quantized_attention_kernel(
    dtype: KvDtype,
    quant: KvQuant,
    head_dim: usize,
    tile: usize,
) -> String {
    format!(
        "paged_attention_{}_{}_hd{head_dim}_q{tile}",
        dtype.suffix(),
        quant.suffix()
    )
}

/// `kv_store_{int8,fp8}_{dtype}`: a step's rotated keys and values into the cache.
pub fn kv_store_kernel(dtype: KvDtype, quant: KvQuant) -> String {
    format!("kv_store_{}_{}", quant.suffix(), dtype.suffix())
}

/// `kv_fp8_scales_{dtype}`: the fp8 scales of a layer's first write.
pub fn fp8_scales_kernel(dtype: KvDtype) -> String {
    format!("kv_fp8_scales_{}", dtype.suffix())
}

/// Threads of every `kv_store_*` and `kv_fp8_scales_*` block.
pub const KV_STORE_THREADS: u32 = 128;

/// The store's grid: int8, one block per (token, KV head, K or V), of which a run's
/// first token's do the work; fp8, one thread per value of each token's K and V.
pub fn kv_store_shape(
    quant: KvQuant,
    tokens: usize,
    num_kv_heads: usize,
    head_dim: usize,
) -> LaunchShape {
    let grid = match quant {
        KvQuant::Int8 => (tokens as u32, num_kv_heads as u32, 2),
        KvQuant::Fp8 => (
            tokens as u32,
            (2 * num_kv_heads * head_dim).div_ceil(KV_STORE_THREADS as usize) as u32,
            1,
        ),
    };
    LaunchShape {
        grid,
        block: KV_STORE_THREADS,
    }
}

/// One block per (KV head, K or V).
pub fn fp8_scales_shape(num_kv_heads: usize) -> LaunchShape {
    LaunchShape {
        grid: (num_kv_heads as u32, 2, 1),
        block: KV_STORE_THREADS,
    }
}

/// One layer's K or V cache as the kernels hold it: bytes `[num_blocks, block_size,
/// num_kv_heads, head_dim]` and their scales ([`KvQuant::scales_len`]).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedCache {
    pub quant: KvQuant,
    pub bytes: Vec<u8>,
    pub scales: Vec<f32>,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl QuantizedCache {
    /// A zeroed cache of `num_blocks` blocks, as a CUDA rank allocates it.
    pub fn new(
        quant: KvQuant,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        QuantizedCache {
            quant,
            bytes: vec![0; num_blocks * block_size * num_kv_heads * head_dim],
            scales: vec![0.0; quant.scales_len(num_blocks, num_kv_heads)],
            block_size,
            num_kv_heads,
            head_dim,
        }
    }

    fn scale_index(&self, slot: usize, head: usize) -> usize {
        match self.quant {
            KvQuant::Int8 => slot / self.block_size * self.num_kv_heads + head,
            KvQuant::Fp8 => head,
        }
    }

    /// Every entry decoded and scaled, in the cache's layout.
    pub fn dequantized(&self) -> Vec<f32> {
        let (nkv, hd) = (self.num_kv_heads, self.head_dim);
        self.bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                let slot = i / (nkv * hd);
                let scale = self.scales[self.scale_index(slot, i / hd % nkv)];
                let raw = match self.quant {
                    KvQuant::Int8 => f32::from(b as i8),
                    KvQuant::Fp8 => e4m3_to_f32(b),
                };
                raw * scale
            })
            .collect()
    }

    /// The host reference of one step's store: `rows` holds each token's `num_kv_heads *
    /// head_dim` values (as the kernel reads them), `slots` its cache slot. The CPU
    /// ranks' write (`crates/engine/src/model/kv_write.rs`) in this layout.
    pub fn store(&mut self, rows: &[f32], slots: &[usize]) {
        let (nkv, hd, bs) = (self.num_kv_heads, self.head_dim, self.block_size);
        let row = nkv * hd;
        match self.quant {
            KvQuant::Fp8 => {
                for h in 0..nkv {
                    if self.scales[h] <= 0.0 {
                        let amax = (0..slots.len())
                            .flat_map(|t| &rows[t * row + h * hd..t * row + (h + 1) * hd])
                            .fold(0f32, |m, x| m.max(x.abs()));
                        self.scales[h] = fp8_scale(amax);
                    }
                }
                for (t, &slot) in slots.iter().enumerate() {
                    for r in 0..row {
                        let x = rows[t * row + r] / self.scales[r / hd];
                        self.bytes[slot * row + r] = e4m3_from_f32(x);
                    }
                }
            }
            KvQuant::Int8 => {
                let mut t0 = 0;
                while t0 < slots.len() {
                    let (slot, start) = (slots[t0], slots[t0] % bs);
                    let len = (t0..slots.len())
                        .take_while(|&t| start + t - t0 < bs && slots[t] == slot + t - t0)
                        .count();
                    for h in 0..nkv {
                        let idx = self.scale_index(slot, h);
                        let run = Int8Run {
                            old_scale: self.scales[idx],
                            start,
                            amax: (t0..t0 + len)
                                .flat_map(|t| &rows[t * row + h * hd..t * row + (h + 1) * hd])
                                .fold(0f32, |m, x| m.max(x.abs())),
                        };
                        let (old, new) = (self.scales[idx], run.scale());
                        let first = slot - start;
                        let at = |i: usize, d: usize| (first + i) * row + h * hd + d;
                        if run.rescales() {
                            for i in 0..start {
                                for d in 0..hd {
                                    let q = self.bytes[at(i, d)] as i8;
                                    self.bytes[at(i, d)] = int8_requantize(q, old, new) as u8;
                                }
                            }
                        }
                        for j in 0..len {
                            for d in 0..hd {
                                let x = rows[(t0 + j) * row + h * hd + d];
                                self.bytes[at(start + j, d)] = int8_quantize(x, new) as u8;
                            }
                        }
                        self.scales[idx] = new;
                    }
                    t0 += len.max(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_entries() {
        assert_eq!(
            quantized_attention_kernel(KvDtype::Bf16, KvQuant::Int8, 128, 16),
            "paged_attention_bf16_int8_hd128_q16"
        );
        assert_eq!(
            kv_store_kernel(KvDtype::Bf16, KvQuant::Fp8),
            "kv_store_fp8_bf16"
        );
        assert_eq!(fp8_scales_kernel(KvDtype::F16), "kv_fp8_scales_f16");
        assert_eq!(KvQuant::of(KvCacheDtype::Bf16), None);
    }

    #[test]
    fn the_reference_store_reads_back_within_a_step() {
        let (bs, nkv, hd) = (4, 2, 8);
        for quant in [KvQuant::Int8, KvQuant::Fp8] {
            let mut cache = QuantizedCache::new(quant, 3, bs, nkv, hd);
            let rows: Vec<f32> = (0..6 * nkv * hd)
                .map(|i| ((i as f32) * 0.37).sin())
                .collect();
            // Positions 0..6 of a sequence in blocks 2 and 0, in two steps.
            let slots = [8, 9, 10, 11, 0, 1];
            cache.store(&rows[..5 * nkv * hd], &slots[..5]);
            cache.store(&rows[5 * nkv * hd..], &slots[5..]);
            let got = cache.dequantized();
            for (t, &slot) in slots.iter().enumerate() {
                for r in 0..nkv * hd {
                    let (g, w) = (got[slot * nkv * hd + r], rows[t * nkv * hd + r]);
                    assert!((g - w).abs() < 0.07, "{quant:?} token {t}: {g} for {w}");
                }
            }
        }
    }
}
