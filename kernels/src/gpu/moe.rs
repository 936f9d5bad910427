//! Launch names and shapes of the mixture-of-experts decode kernels (`kernels/cuda/moe.cu`):
//! the router's choice per token, the chosen experts' products through a table of weight
//! addresses, and the weighted sum per token.

use crate::gpu::launch::{KvDtype, LaunchShape};

/// Each token's experts and weights from the router's f32 logits (one warp per token).
pub const MOE_ROUTE_KERNEL: &str = "moe_route_f32";
/// The weighted sum of each token's slots, in ascending expert order.
pub const MOE_COMBINE_KERNEL: &str = "moe_combine_f32";
/// Most experts a router may score (moe.cu's shared arrays).
pub const MOE_MAX_EXPERTS: usize = 1024;
/// Most groups of experts a sigmoid router may rank.
pub const MOE_MAX_GROUPS: usize = 64;
/// Output rows of one matvec block: a warp each.
pub const MOE_MATVEC_WARPS: usize = 8;

/// The element type of the experts' weights: 16-bit on a GPU, f32 where the host
/// emulates one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeWeight {
    Bf16,
    F16,
    F32,
}

impl MoeWeight {
    fn suffix(self) -> &'static str {
        match self {
            MoeWeight::Bf16 => "bf16",
            MoeWeight::F16 => "f16",
            MoeWeight::F32 => "f32",
        }
    }
}

/// `moe_matvec_w{weight}_x{x}_o{out}`: experts' products of activations `x`, written in
/// `x`'s type or (`f32_out`) in f32. `None` for 16-bit weights of the other 16-bit type
/// than `x` (not compiled).
pub fn moe_matvec_kernel(weight: MoeWeight, x: KvDtype, f32_out: bool) -> Option<String> {
    let compiled = match weight {
        MoeWeight::Bf16 => x == KvDtype::Bf16,
        MoeWeight::F16 => x == KvDtype::F16,
        MoeWeight::F32 => true,
    };
    let out = if f32_out { "f32" } else { x.suffix() };
    compiled.then(|| format!("moe_matvec_w{}_x{}_o{out}", weight.suffix(), x.suffix()))
}

/// Every matvec kernel moe.cu defines.
pub fn moe_matvec_kernels() -> Vec<String> {
    let mut names = Vec::new();
    for weight in [MoeWeight::Bf16, MoeWeight::F16, MoeWeight::F32] {
        for x in [KvDtype::Bf16, KvDtype::F16] {
            for f32_out in [false, true] {
                names.extend(moe_matvec_kernel(weight, x, f32_out));
            }
        }
    }
    names
}

/// One warp per token.
pub fn moe_route_shape(tokens: usize) -> LaunchShape {
    LaunchShape {
        grid: (tokens as u32, 1, 1),
        block: 32,
    }
}

/// Blocks of [`MOE_MATVEC_WARPS`] output rows across each matrix, one block row per
/// (token, slot).
pub fn moe_matvec_shape(rows: usize, slots: usize) -> LaunchShape {
    LaunchShape {
        grid: (rows.div_ceil(MOE_MATVEC_WARPS) as u32, slots as u32, 1),
        block: (32 * MOE_MATVEC_WARPS) as u32,
    }
}

/// A grid-stride loop over `tokens x cols` outputs.
pub fn moe_combine_shape(total: usize) -> LaunchShape {
    LaunchShape {
        grid: (total.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block: 256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_names_cover_the_compiled_pairs_only() {
        assert_eq!(
            moe_matvec_kernel(MoeWeight::Bf16, KvDtype::Bf16, true).as_deref(),
            Some("moe_matvec_wbf16_xbf16_of32")
        );
        assert_eq!(
            moe_matvec_kernel(MoeWeight::F32, KvDtype::Bf16, false).as_deref(),
            Some("moe_matvec_wf32_xbf16_obf16")
        );
        assert_eq!(
            moe_matvec_kernel(MoeWeight::Bf16, KvDtype::F16, false),
            None
        );
        assert_eq!(moe_matvec_kernels().len(), 8);
        let shape = moe_matvec_shape(17, 3);
        assert_eq!(shape.grid, (3, 3, 1));
        assert_eq!(shape.block, 256);
    }
}
