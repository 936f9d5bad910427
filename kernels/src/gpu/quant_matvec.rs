//! Decode-time matrix-vector products over GGUF-quantized weights
//! (`cuda/quant_matvec.cu`): their names, launch shapes and the layout of what passes
//! between the two launches. The host reference is [`super::quant_reference`].
//!
//! A product `y[rows, n] = x[rows, k] · Wᵀ` for 1 to [`MAX_ROWS`] rows is two launches:
//! `quantize_q8_act_{f32,bf16}` turns each 32 activations of a row into a [`Q8Act`]
//! (int8 values with one scale, as llama.cpp's q8_1), then `quant_matvec_{type}_r{rows}`
//! runs one warp per output column, each lane decoding one 32-weight unit at a time and
//! taking its integer dot products (`__dp4a`) with all rows, so each weight block is read
//! once per launch. `W` is `n` rows of `k / block_elems` blocks in ggml's layout, as a
//! GGUF file stores them; `y` is f32, row-major.
//!
//! The engine's CUDA ranks take them for products of 1 to [`MAX_ROWS`] rows
//! (`crates/engine/src/model/cuda/quant_matvec.rs`); candle's `QMatMul::forward` takes the
//! rest. `crates/engine/tests/gpu/quant_matvec.rs` times both on a GPU.

use super::launch::LaunchShape;

/// Most activation rows one launch takes (kernels `_r1` to `_r8`).
pub const MAX_ROWS: usize = 8;
/// Output columns per thread block: one warp each.
pub const QMV_WARPS: u32 = 4;
/// Threads of every block of both kernels.
pub const QMV_THREADS: u32 = QMV_WARPS * 32;
/// Activations per [`Q8Act`].
pub const Q8_BLOCK: usize = 32;
/// Bytes of one [`Q8Act`] on the device: `d`, `s`, 32 int8 values.
pub const Q8_ACT_BYTES: usize = 40;

/// The GGUF weight types the kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufQuant {
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl GgufQuant {
    pub const ALL: [GgufQuant; 6] = [
        GgufQuant::Q4_0,
        GgufQuant::Q4_1,
        GgufQuant::Q8_0,
        GgufQuant::Q4K,
        GgufQuant::Q5K,
        GgufQuant::Q6K,
    ];

    /// Weights per block (per super-block for the k-quants).
    pub fn block_elems(self) -> usize {
        match self {
            GgufQuant::Q4_0 | GgufQuant::Q4_1 | GgufQuant::Q8_0 => 32,
            GgufQuant::Q4K | GgufQuant::Q5K | GgufQuant::Q6K => 256,
        }
    }

    /// Bytes per block, as ggml lays it out.
    pub fn block_bytes(self) -> usize {
        match self {
            GgufQuant::Q4_0 => 18,
            GgufQuant::Q4_1 => 20,
            GgufQuant::Q8_0 => 34,
            GgufQuant::Q4K => 144,
            GgufQuant::Q5K => 176,
            GgufQuant::Q6K => 210,
        }
    }

    pub fn suffix(self) -> &'static str {
        match self {
            GgufQuant::Q4_0 => "q4_0",
            GgufQuant::Q4_1 => "q4_1",
            GgufQuant::Q8_0 => "q8_0",
            GgufQuant::Q4K => "q4_k",
            GgufQuant::Q5K => "q5_k",
            GgufQuant::Q6K => "q6_k",
        }
    }

    /// Bytes of an `n × k` weight.
    pub fn weight_bytes(self, n: usize, k: usize) -> usize {
        n * (k / self.block_elems()) * self.block_bytes()
    }
}

/// Element type of the activations the quantize kernel reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActDtype {
    F32,
    Bf16,
}

impl ActDtype {
    pub fn suffix(self) -> &'static str {
        match self {
            ActDtype::F32 => "f32",
            ActDtype::Bf16 => "bf16",
        }
    }
}

/// `quantize_q8_act_{dtype}`.
pub fn quantize_act_kernel(dtype: ActDtype) -> String {
    format!("quantize_q8_act_{}", dtype.suffix())
}

/// `quant_matvec_{type}_r{rows}`.
pub fn quant_matvec_kernel(quant: GgufQuant, rows: usize) -> String {
    format!("quant_matvec_{}_r{rows}", quant.suffix())
}

/// One warp per [`Q8Act`]: grid `(ceil(k / 32 / QMV_WARPS), rows)`.
pub fn quantize_act_shape(rows: usize, k: usize) -> LaunchShape {
    LaunchShape {
        grid: (
            (k / Q8_BLOCK).div_ceil(QMV_WARPS as usize) as u32,
            rows as u32,
            1,
        ),
        block: QMV_THREADS,
    }
}

/// One warp per output column: grid `ceil(n / QMV_WARPS)`.
pub fn quant_matvec_shape(n: usize) -> LaunchShape {
    LaunchShape {
        grid: (n.div_ceil(QMV_WARPS as usize) as u32, 1, 1),
        block: QMV_THREADS,
    }
}

/// Refuses a product the kernels do not compute: 1 to [`MAX_ROWS`] rows, `k` a whole
/// number of blocks, sizes that fit the kernels' `int` arguments.
pub fn check_matvec(quant: GgufQuant, rows: usize, n: usize, k: usize) -> Result<(), String> {
    if rows == 0 || rows > MAX_ROWS {
        return Err(format!(
            "{rows} rows: the quantized matvec takes 1 to {MAX_ROWS}"
        ));
    }
    if k == 0 || !k.is_multiple_of(quant.block_elems()) {
        return Err(format!(
            "k = {k} is not a whole number of {:?} blocks of {}",
            quant,
            quant.block_elems()
        ));
    }
    if n == 0 || n > i32::MAX as usize || rows * k > i32::MAX as usize {
        return Err(format!(
            "{rows} x {k} -> {n} exceeds the kernels' int sizes"
        ));
    }
    Ok(())
}

/// 32 activations as the kernels hold them: `x[i] ≈ d · qs[i]`, `s = d · Σ qs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Q8Act {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; Q8_BLOCK],
}

impl Q8Act {
    /// 32 activations quantized as `quantize_q8_act_*` does: `d = amax / 127`, each value
    /// `round(x / d)` (half away from zero), all 0 when the block is.
    pub fn quantize(x: &[f32; Q8_BLOCK]) -> Q8Act {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let mut qs = [0i8; Q8_BLOCK];
        if amax != 0.0 {
            for (q, v) in qs.iter_mut().zip(x) {
                *q = (v / d).round() as i8;
            }
        }
        let sum: i32 = qs.iter().map(|q| i32::from(*q)).sum();
        Q8Act {
            d,
            s: d * sum as f32,
            qs,
        }
    }

    /// The device layout: `d`, `s` (little-endian f32), then the 32 values.
    pub fn to_bytes(&self) -> [u8; Q8_ACT_BYTES] {
        let mut b = [0u8; Q8_ACT_BYTES];
        b[..4].copy_from_slice(&self.d.to_le_bytes());
        b[4..8].copy_from_slice(&self.s.to_le_bytes());
        for (o, q) in b[8..].iter_mut().zip(self.qs) {
            *o = q as u8;
        }
        b
    }

    /// The values the kernels multiply: `d · qs[i]`.
    pub fn dequantize(&self) -> [f32; Q8_BLOCK] {
        self.qs.map(|q| self.d * f32::from(q))
    }
}

/// Each row of `x` (`k` wide; `k` a multiple of 32) as its [`Q8Act`] blocks.
pub fn quantize_rows(x: &[f32], k: usize) -> Vec<Q8Act> {
    x.chunks_exact(Q8_BLOCK)
        .take(x.len() / k.max(1) * (k / Q8_BLOCK))
        .map(|c| {
            let mut block = [0f32; Q8_BLOCK];
            block.copy_from_slice(c);
            Q8Act::quantize(&block)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_shapes() {
        assert_eq!(
            quant_matvec_kernel(GgufQuant::Q4K, 3),
            "quant_matvec_q4_k_r3"
        );
        assert_eq!(quantize_act_kernel(ActDtype::Bf16), "quantize_q8_act_bf16");
        assert_eq!(quant_matvec_shape(4097).grid, (1025, 1, 1));
        assert_eq!(quantize_act_shape(3, 4096).grid, (32, 3, 1));
        assert_eq!(GgufQuant::Q6K.weight_bytes(2, 512), 2 * 2 * 210);
        assert!(check_matvec(GgufQuant::Q4K, 8, 7, 512).is_ok());
        assert!(check_matvec(GgufQuant::Q4K, 9, 7, 512).is_err());
        assert!(check_matvec(GgufQuant::Q4K, 1, 7, 96).is_err());
        assert!(check_matvec(GgufQuant::Q4_0, 1, 7, 96).is_ok());
    }

    #[test]
    fn activation_blocks_round_to_the_nearest_step() {
        let mut x = [0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 12.5) * 0.3;
        }
        let a = Q8Act::quantize(&x);
        assert_eq!(a.d, 18.5 * 0.3 / 127.0);
        assert_eq!(a.qs[31], 127);
        for (v, q) in x.iter().zip(a.dequantize()) {
            assert!((v - q).abs() <= a.d / 2.0 * 1.0001);
        }
        let zero = Q8Act::quantize(&[0.0; 32]);
        assert_eq!((zero.d, zero.s, zero.qs), (0.0, 0.0, [0; 32]));
    }
}
