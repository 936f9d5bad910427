//! Our CUDA kernels other than attention (`attention.rs`) against plain host references
//! on random inputs: RoPE with the KV write; SiLU·up, GELU·up and gpt-oss's clamped gate;
//! the f32-output GEMM; the residual add with RMSNorm; the arg-max and sampling
//! reductions.

use candle_core::{DType, Device, Tensor};
use tessera_engine::config::ClampedSwiglu;
use tessera_engine::config::RopeScaling;
use tessera_engine::device::buffers::Gpu;
use tessera_engine::device::dtype::candle_dtype;
use tessera_engine::model::batch::Batch;
use tessera_engine::model::cuda::gemm::matmul_f32_out;
use tessera_engine::model::cuda::kernels::{
    add_rms_norm, gated_mul, rope_write_kv, HeadLayout, RopeTables,
};
use tessera_engine::model::cuda::reductions::{argmax_rows, reduce_rows};
use tessera_engine::model::cuda::step_meta::StepMeta;
use tessera_engine::model::cuda::MlpGate;
use tessera_engine::model::rope::RopeTable;
use tessera_engine::model::step_meta::PackedMeta;
use tessera_engine::Activation;
use tessera_engine::RopeStyle;
use tessera_kernels::gpu::launch::{Gate, KvDtype, HEAD_DIMS, MAX_CANDIDATES};
use tessera_kernels::gpu::reference::{self, scattered, StepSeq};

use crate::report::{check, download, gpu, max_abs_diff, rounded, upload, Lcg};

/// Multiprocessors × 2 on an H100; only decides how decode contexts are split.
pub(crate) const TARGET_BLOCKS: usize = 264;

pub(crate) fn launcher(d: &Device) -> Gpu<'_> {
    Gpu::of(d).expect("a CUDA device")
}

fn cuda(d: &Device) -> &candle_core::CudaDevice {
    match d {
        Device::Cuda(c) => c,
        _ => panic!("not a CUDA device"),
    }
}

/// A batch of sequences `(start_pos, new tokens)` whose blocks are scattered over a
/// cache, and the sequences as the references take them.
pub(crate) fn scattered_batch(
    seqs: &[(usize, usize)],
    bs: usize,
    rng: &mut Lcg,
) -> (Batch, Vec<StepSeq>, usize) {
    let (steps, num_blocks) = scattered(seqs, bs, rng);
    let batch = Batch::of_steps(&steps, bs);
    (batch, steps, num_blocks)
}

#[test]
fn rope_and_kv_write_match_the_reference() {
    let device = gpu();
    let mut rng = Lcg(3);
    // Whole heads, and three quarters of each head rotated (Phi-4-mini's partial rotary).
    let shapes = HEAD_DIMS
        .iter()
        .flat_map(|hd| [(*hd, *hd), (*hd, hd * 3 / 4)]);
    for style in [RopeStyle::Half, RopeStyle::Interleaved] {
        for (hd, rotary) in shapes.clone() {
            let (nq, nkv, bs) = (6, 2, 16);
            let dtype = KvDtype::Bf16;
            let dt = candle_dtype(dtype);
            let (batch, _, num_blocks) =
                scattered_batch(&[(0, 9), (300, 1), (40, 5)], bs, &mut rng);
            let n = batch.num_tokens();
            let width = (nq + 2 * nkv) * hd;
            let qkv = rounded(&rng.values(n * width), dt);
            let qkv_dev = upload(&qkv, &[n, width], dt, &device);
            let shape = (num_blocks, bs, nkv, hd);
            let k_dev = Tensor::zeros(shape, dt, &device).expect("zeros");
            let v_dev = Tensor::zeros(shape, dt, &device).expect("zeros");
            let table = RopeTable::scaled((hd, rotary), 10_000.0, &RopeScaling::None, 512, style);
            let (cos, sin) = table.tables_on(&device).expect("tables");
            let rope = RopeTables {
                cos,
                sin,
                interleaved: table.interleaved(),
                rotary_half: table.rotary_half(),
            };
            let kv_of_q: Vec<u32> = (0..nq).map(|h| (h / (nq / nkv)) as u32).collect();
            let packed = PackedMeta::new(&batch, &kv_of_q, TARGET_BLOCKS).expect("pack");
            let meta = StepMeta::upload(packed, bs, &device).expect("upload");
            let heads = HeadLayout {
                num_q_heads: nq,
                num_kv_heads: nkv,
                head_dim: hd,
            };
            rope_write_kv(
                launcher(&device),
                dtype,
                &qkv_dev,
                &k_dev,
                &v_dev,
                &meta,
                &rope,
                heads,
            )
            .expect("rope");
            let (q_got, k_got, v_got) = (download(&qkv_dev), download(&k_dev), download(&v_dev));
            let mut err = 0f32;
            let mut v_exact = true;
            for t in 0..n {
                let pos = batch.positions[t];
                let mut row = qkv[t * width..(t + 1) * width].to_vec();
                table.apply(&mut row[..(nq + nkv) * hd], pos);
                let slot = batch.slots[t];
                let q_dev = &q_got[t * width..t * width + nq * hd];
                err = err.max(max_abs_diff(q_dev, &row[..nq * hd]));
                let cache_row = slot * nkv * hd..(slot + 1) * nkv * hd;
                err = err.max(max_abs_diff(
                    &k_got[cache_row.clone()],
                    &row[nq * hd..(nq + nkv) * hd],
                ));
                v_exact &= v_got[cache_row] == row[(nq + nkv) * hd..];
            }
            check(
                &format!("rope + KV write bf16 hd{hd} rotating {rotary} {style:?}"),
                format!("max |err| {err:.2e}, values copied exactly: {v_exact}"),
                "< 1e-2, exact".into(),
                err < 1e-2 && v_exact,
            );
        }
    }
}

#[test]
fn gated_mul_and_f32_gemm_match_the_reference() {
    let device = gpu();
    let mut rng = Lcg(5);
    for dtype in [KvDtype::Bf16, KvDtype::F16] {
        let dt = candle_dtype(dtype);
        let (rows, width) = (37, 300);
        let gu = rounded(&rng.values(rows * 2 * width), dt);
        for (activation, label) in [(Activation::Silu, "silu"), (Activation::GeluTanh, "gelu")] {
            let out = gated_mul(
                launcher(&device),
                dtype,
                &upload(&gu, &[rows, 2 * width], dt, &device),
                width,
                activation.into(),
            )
            .expect("gated_mul");
            let gate = match activation {
                Activation::Silu => Gate::Silu,
                Activation::GeluTanh => Gate::GeluTanh,
            };
            let want = reference::gated(&gu, width, gate);
            let err = max_abs_diff(&download(&out), &rounded(&want, dt));
            let bound = if dtype == KvDtype::Bf16 { 1e-2 } else { 2e-3 };
            check(
                &format!("{label}·up {}", dtype.suffix()),
                format!("max |err| {err:.2e}"),
                format!("< {bound:.0e}"),
                err < bound,
            );
        }
        // gpt-oss's clamped gate, on values that both clamps bend.
        let wide: Vec<f32> = gu.iter().map(|v| 10.0 * v).collect();
        let wide = rounded(&wide, dt);
        let c = ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0,
        };
        let out = gated_mul(
            launcher(&device),
            dtype,
            &upload(&wide, &[rows, 2 * width], dt, &device),
            width,
            MlpGate::Clamped(c),
        )
        .expect("clamped gate");
        let want = reference::clamped_gated(&wide, width, c.alpha, c.limit);
        let err = max_abs_diff(&download(&out), &rounded(&want, dt));
        let bound = if dtype == KvDtype::Bf16 { 1e-1 } else { 2e-2 };
        check(
            &format!("clamped swiglu {} (limit 7)", dtype.suffix()),
            format!("max |err| {err:.2e}"),
            format!("< {bound:.0e}"),
            err < bound,
        );
        let (m, k, n) = (19, 512, 333);
        let x = rounded(&rng.values(m * k), dt);
        let w = rounded(&rng.values(n * k), dt);
        let y = matmul_f32_out(
            cuda(&device),
            &upload(&x, &[m, k], dt, &device),
            &upload(&w, &[n, k], dt, &device),
        )
        .expect("gemm");
        assert_eq!(y.dtype(), DType::F32);
        let want: Vec<f32> = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                (0..k).map(|c| x[i * k + c] * w[j * k + c]).sum()
            })
            .collect();
        let err = max_abs_diff(&download(&y), &want);
        check(
            &format!("GEMM {} in, f32 out, {m}x{k}x{n}", dtype.suffix()),
            format!("max |err| {err:.2e}"),
            "< 1e-3".into(),
            err < 1e-3,
        );
    }
}

#[test]
fn add_rms_norm_matches_the_reference() {
    let device = gpu();
    let mut rng = Lcg(17);
    // Rows held in registers (4096, 5120), wider than the registers hold (20000), and not a
    // multiple of 4 wide (1001: the scalar path).
    for (rows, cols) in [(1, 4096), (37, 384), (5, 5120), (3, 20000), (2, 1001)] {
        let x: Vec<f32> = rng.values(rows * cols).iter().map(|v| 3.0 * v).collect();
        let d = rng.values(rows * cols);
        let w: Vec<f32> = rng.values(cols).iter().map(|v| 1.0 + 0.1 * v).collect();
        let (xd, dd) = (
            upload(&x, &[rows, cols], DType::F32, &device),
            upload(&d, &[rows, cols], DType::F32, &device),
        );
        let wd = upload(&w, &[cols], DType::F32, &device);
        for with_delta in [false, true] {
            let delta = with_delta.then_some(&dd);
            let (sum, h) = add_rms_norm(launcher(&device), KvDtype::Bf16, &xd, delta, &wd, 1e-5)
                .expect("add_rms_norm");
            let (want_sum, want_h) =
                reference::add_rms_norm(&x, with_delta.then_some(&d[..]), &w, 1e-5);
            let sum_err = max_abs_diff(&download(&sum), &want_sum);
            let h_err = max_abs_diff(&download(&h), &rounded(&want_h, DType::BF16));
            check(
                &format!("residual add + RMSNorm {rows}x{cols}, delta: {with_delta}"),
                format!("sum max |err| {sum_err:.2e}, norm max |err| {h_err:.2e}"),
                "0 (sum), < 2e-2 (bf16 norm)".into(),
                sum_err == 0.0 && h_err < 2e-2,
            );
        }
    }
}

#[test]
fn argmax_rows_matches_the_host_sampler() {
    let device = gpu();
    let mut rng = Lcg(23);
    for (rows, cols) in [(1, 128_256), (7, 151_936), (3, 1000), (2, 5)] {
        let mut logits = rng.values(rows * cols);
        // Plant ties for the maximum in some rows: the lowest index must win.
        for r in (0..rows).step_by(2) {
            let (a, b) = (rng.below(cols), rng.below(cols));
            logits[r * cols + a] = 7.0;
            logits[r * cols + b] = 7.0;
        }
        let got = argmax_rows(
            launcher(&device),
            &upload(&logits, &[rows, cols], DType::F32, &device),
        )
        .expect("argmax");
        let want: Vec<u32> = logits
            .chunks(cols)
            .map(tessera_engine::sampler::argmax)
            .collect();
        check(
            &format!("arg-max of {rows} rows of {cols}"),
            format!(
                "{} of {rows} rows agree",
                got.iter().zip(&want).filter(|(a, b)| a == b).count()
            ),
            "all, lowest index on ties".into(),
            got == want,
        );
    }
}

#[test]
fn sampling_candidates_match_the_host_sampler() {
    let device = gpu();
    let mut rng = Lcg(29);
    for (spread, cols) in [(40.0f32, 128_256), (6.0, 151_936), (0.3, 20_000)] {
        let rows = 4;
        let mut logits: Vec<f32> = rng.values(rows * cols).iter().map(|v| spread * v).collect();
        logits[5] = f32::NAN;
        logits[cols + 9] = f32::NEG_INFINITY;
        let temps = [1.0, 0.7, 0.05, 1.5];
        let got = reduce_rows(
            launcher(&device),
            &upload(&logits, &[rows, cols], DType::F32, &device),
            Some(&temps),
            true,
        )
        .expect("reduce");
        let mut agree = 0;
        let mut copied = 0;
        for (r, t) in temps.iter().enumerate() {
            let row = &logits[r * cols..(r + 1) * cols];
            let want = tessera_engine::sampler::sampling_candidates(row, *t);
            match &got.candidates[r] {
                Some(c) => agree += usize::from(*c == want),
                None => copied += usize::from(want.len() > MAX_CANDIDATES),
            }
            agree += usize::from(got.argmax[r] == tessera_engine::sampler::argmax(row));
        }
        check(
            &format!("sampling candidates of {rows} rows of {cols}, spread {spread}"),
            format!(
                "{agree} of {} rows and arg-maxes agree, {copied} left whole",
                2 * rows - copied
            ),
            "all; rows over the cap left whole".into(),
            agree + copied == 2 * rows,
        );
        // The log-sum-exp against an f64 sum; the NaN of row 0 makes its sum NaN, as the
        // host's, and a NaN never passes the bound, so that row is checked apart.
        let lse = got.log_sum_exp.clone().unwrap_or_default();
        let mut worst = 0f64;
        let mut ok = lse.len() == rows && lse[0].is_nan();
        for r in 1..rows.min(lse.len()) {
            let row = &logits[r * cols..(r + 1) * cols];
            let want = row.iter().map(|l| f64::from(*l).exp()).sum::<f64>().ln();
            let err = (f64::from(lse[r]) - want).abs() / want.abs().max(1.0);
            ok &= err < 1e-5;
            worst = worst.max(err);
        }
        check(
            &format!("log-sum-exp of {rows} rows of {cols}, spread {spread}"),
            format!(
                "relative |err| {worst:.2e}; NaN row NaN: {}",
                lse.first().is_some_and(|l| l.is_nan())
            ),
            "< 1e-5; NaN for a row holding NaN".into(),
            ok,
        );
    }
}
