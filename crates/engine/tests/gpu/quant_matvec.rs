//! The quantized decode kernels (`kernels/cuda/quant_matvec.cu`) on the device: each GGUF
//! type at 1 to 8 rows against the host reference with the same int8 activations
//! (`tessera_kernels::gpu::quant_reference`), then a timing of ours against candle's
//! `QMatMul::forward` on CUDA at the Llama-3.1-8B decode shapes for each type.
//!
//! The engine's CUDA ranks take these kernels for 1 to 8 rows of every type here
//! (`model/cuda/quant_matvec.rs`); the timing says, by type and row count, where candle's
//! would be faster. Both sides are timed from f32 activations.

use std::time::Instant;

use std::sync::Arc;

use candle_core::cuda::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QMatMul};
use candle_core::{Device, Module, Tensor};
use half::f16;
use tessera_kernels::gpu::ptx;
use tessera_kernels::gpu::quant_matvec::{
    quant_matvec_kernel, quant_matvec_shape, quantize_act_kernel, quantize_act_shape, ActDtype,
    GgufQuant, MAX_ROWS, Q8_ACT_BYTES, Q8_BLOCK,
};
use tessera_kernels::gpu::quant_reference::{abs_products, dequantize, matvec_q8_f64};

use crate::report::{check, gpu, Lcg};

/// Relative f32 rounding allowed against the f64 product with the same int8 activations
/// (the emulated kernels stay under 1e-7; the device may fuse multiply-adds).
const ROUNDING: f64 = 1e-5;

fn cuda(d: &Device) -> &candle_core::CudaDevice {
    match d {
        Device::Cuda(c) => c,
        _ => panic!("not a CUDA device"),
    }
}

fn ggml(q: GgufQuant) -> GgmlDType {
    match q {
        GgufQuant::Q4_0 => GgmlDType::Q4_0,
        GgufQuant::Q4_1 => GgmlDType::Q4_1,
        GgufQuant::Q8_0 => GgmlDType::Q8_0,
        GgufQuant::Q4K => GgmlDType::Q4K,
        GgufQuant::Q5K => GgmlDType::Q5K,
        GgufQuant::Q6K => GgmlDType::Q6K,
    }
}

/// `n × k` weights of random bytes with f16 scales that keep the weights near 1.
fn random_blocks(q: GgufQuant, n: usize, k: usize, rng: &mut Lcg) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..q.weight_bytes(n, k))
        .map(|_| rng.next_u32() as u8)
        .collect();
    for b in bytes.chunks_exact_mut(q.block_bytes()) {
        let mut set = |at: usize, v: f32| {
            b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        };
        match q {
            GgufQuant::Q4_0 | GgufQuant::Q8_0 => set(0, 0.02),
            GgufQuant::Q4_1 => {
                set(0, 0.02);
                set(2, -0.15);
            }
            GgufQuant::Q4K | GgufQuant::Q5K => {
                set(0, 0.002);
                set(2, 0.005);
            }
            GgufQuant::Q6K => set(208, 0.001),
        }
    }
    bytes
}

/// Our two launches on the device: `x` f32 `[rows, k]`, `y` f32 `[rows, n]`.
struct Ours {
    stream: Arc<CudaStream>,
    quantize: CudaFunction,
    matvec: CudaFunction,
    acts: CudaSlice<u8>,
    rows: usize,
    n: usize,
    k: usize,
}

impl Ours {
    fn new(dev: &candle_core::CudaDevice, q: GgufQuant, rows: usize, n: usize, k: usize) -> Self {
        let load = |name: String| {
            dev.get_or_load_custom_func(&name, "tessera_quant_matvec", ptx::QUANT_MATVEC)
                .expect("load kernel")
                .into_cuda_function()
        };
        let acts = dev
            .cuda_stream()
            .alloc_zeros::<u8>(rows * (k / Q8_BLOCK) * Q8_ACT_BYTES)
            .expect("alloc");
        Self {
            stream: dev.cuda_stream(),
            quantize: load(quantize_act_kernel(ActDtype::F32)),
            matvec: load(quant_matvec_kernel(q, rows)),
            acts,
            rows,
            n,
            k,
        }
    }

    fn run(&mut self, w: &CudaSlice<u8>, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) {
        let cfg = |s: tessera_kernels::gpu::launch::LaunchShape| LaunchConfig {
            grid_dim: s.grid,
            block_dim: (s.block, 1, 1),
            shared_mem_bytes: 0,
        };
        let (n, k) = (self.n as i32, self.k as i32);
        let mut b = self.stream.launch_builder(&self.quantize);
        b.arg(x).arg(&mut self.acts).arg(&k);
        // SAFETY: `x` holds rows × k floats, `acts` one 40-byte block per 32 of them.
        unsafe { b.launch(cfg(quantize_act_shape(self.rows, self.k))) }.expect("quantize");
        let mut b = self.stream.launch_builder(&self.matvec);
        b.arg(w).arg(&self.acts).arg(y).arg(&n).arg(&k);
        // SAFETY: `w` holds n rows of k weights' blocks, `y` rows × n floats.
        unsafe { b.launch(cfg(quant_matvec_shape(self.n))) }.expect("matvec");
    }
}

#[test]
fn quantized_matvec_matches_the_reference() {
    let device = gpu();
    let dev = cuda(&device);
    let stream = dev.cuda_stream();
    let mut rng = Lcg(43);
    for q in GgufQuant::ALL {
        let (n, k) = (301, 4 * 256 + q.block_elems());
        let bytes = random_blocks(q, n, k, &mut rng);
        let w = dequantize(q, &bytes, n, k).expect("dequantize");
        let w_dev = stream.clone_htod(&bytes).expect("upload");
        let mut worst = 0f64;
        for rows in 1..=MAX_ROWS {
            let x = rng.values(rows * k);
            let x_dev = stream.clone_htod(&x).expect("upload");
            let mut y_dev = stream.alloc_zeros::<f32>(rows * n).expect("alloc");
            Ours::new(dev, q, rows, n, k).run(&w_dev, &x_dev, &mut y_dev);
            let y = stream.clone_dtoh(&y_dev).expect("download");
            let want = matvec_q8_f64(&w, &x, n, k);
            let scale = abs_products(&w, &x, n, k);
            for ((y, want), s) in y.iter().zip(&want).zip(&scale) {
                worst = worst.max((f64::from(*y) - want).abs() / (ROUNDING * s.max(1e-30)));
            }
        }
        check(
            &format!("quant_matvec {}, 1..8 rows, {n}x{k}", q.suffix()),
            format!("|y - y_q8| / ({ROUNDING:e} Σ|wx|) {worst:.3}"),
            "<= 1".into(),
            worst <= 1.0,
        );
    }
}

/// Microseconds per call of `f`, the device synchronised around `iters` calls.
fn time_us(device: &Device, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    device.synchronize().expect("sync");
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    device.synchronize().expect("sync");
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

#[test]
fn quantized_matvec_timing_against_candle() {
    let device = gpu();
    let dev = cuda(&device);
    let stream = dev.cuda_stream();
    let mut rng = Lcg(44);
    // Llama-3.1-8B: q/o projections, gate/up, down.
    let shapes = [(4096, 4096), (14336, 4096), (4096, 14336)];
    println!("QMV-TIMING | type | n x k | rows | ours us | candle us | ours GB/s | candle/ours");
    for q in GgufQuant::ALL {
        for (n, k) in shapes {
            let bytes = random_blocks(q, n, k, &mut rng);
            let w_dev = stream.clone_htod(&bytes).expect("upload");
            let qt = qtensor_from_ggml(ggml(q), &bytes, vec![n, k], &device).expect("qtensor");
            let theirs = QMatMul::from_qtensor(qt).expect("QMatMul");
            for rows in [1, 2, 4, 8] {
                let x = rng.values(rows * k);
                let x_dev = stream.clone_htod(&x).expect("upload");
                let x_t = Tensor::from_slice(&x, (rows, k), &device).expect("x");
                let mut y_dev = stream.alloc_zeros::<f32>(rows * n).expect("alloc");
                let mut ours = Ours::new(dev, q, rows, n, k);
                let ours_us = time_us(&device, 100, || ours.run(&w_dev, &x_dev, &mut y_dev));
                let candle_us = time_us(&device, 100, || {
                    theirs.forward(&x_t).expect("candle forward");
                });
                let gbs = bytes.len() as f64 / ours_us / 1e3;
                println!(
                    "QMV-TIMING | {} | {n}x{k} | {rows} | {ours_us:.1} | {candle_us:.1} | \
                     {gbs:.0} | {:.2}",
                    q.suffix(),
                    candle_us / ours_us
                );
            }
        }
    }
}
