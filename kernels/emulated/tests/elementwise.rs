//! The CUDA kernels around attention, run on CPU threads, against host references:
//! RoPE with the KV-cache write, SiLU·up, GELU·up and gpt-oss's clamped gate, the
//! residual add with RMSNorm, and the arg-max of logit rows.

mod common;

use common::{kv_of_q, rounded, to_f32, Step};
use half::{bf16, f16};
use tessera_engine::config::RopeScaling;
use tessera_engine::model::rope::RopeTable;
use tessera_engine::RopeStyle;
use tessera_kernels::gpu::launch::{Gate, HEAD_DIMS};
use tessera_kernels::gpu::reference::{self, max_abs_diff, Lcg};
use tessera_kernels_emulated::{
    add_rms_norm, argmax_rows, clamped_swiglu_mul, gated_mul, rope_write_kv, Element, Heads,
    RopePairs,
};

fn rope_and_kv_write<T: Element>(bound: f32) {
    let mut rng = Lcg(3);
    // Whole heads, and three quarters of each head rotated (Phi-4-mini's partial rotary).
    let shapes = HEAD_DIMS
        .iter()
        .flat_map(|hd| [(*hd, *hd), (*hd, hd * 3 / 4)]);
    for style in [RopeStyle::Half, RopeStyle::Interleaved] {
        for (hd, rotary) in shapes.clone() {
            let (nq, nkv, bs) = (6, 2, 16);
            let step = Step::new(
                &[(0, 9), (300, 1), (40, 5)],
                bs,
                &kv_of_q(nq, nkv),
                &mut rng,
            );
            let heads = Heads {
                num_q_heads: nq,
                num_kv_heads: nkv,
                head_dim: hd,
            };
            let n = step.num_tokens();
            let width = heads.qkv_width();
            let (mut qkv, qkv32) = rounded::<T>(&rng.values(n * width));
            let cache = step.num_blocks * bs * nkv * hd;
            let mut k = vec![T::from_f32(0.0); cache];
            let mut v = vec![T::from_f32(0.0); cache];
            let table = RopeTable::scaled((hd, rotary), 10_000.0, &RopeScaling::None, 512, style);
            let (cos, sin) = table.tables();
            let pairs = RopePairs {
                interleaved: table.interleaved(),
                rotary_half: table.rotary_half(),
            };
            rope_write_kv(
                &mut qkv,
                &mut k,
                &mut v,
                &step.tables(),
                cos,
                sin,
                pairs,
                heads,
            )
            .expect("the kernel runs");
            let (q_got, k_got, v_got) = (to_f32(&qkv), to_f32(&k), to_f32(&v));
            let tables = step.tables();
            for t in 0..n {
                let pos = tables.positions[t] as usize;
                let mut row = qkv32[t * width..(t + 1) * width].to_vec();
                table.apply(&mut row[..(nq + nkv) * hd], pos);
                let slot = tables.slots[t] as usize;
                let cache_row = slot * nkv * hd..(slot + 1) * nkv * hd;
                let q_err = max_abs_diff(&q_got[t * width..t * width + nq * hd], &row[..nq * hd]);
                let k_err = max_abs_diff(&k_got[cache_row.clone()], &row[nq * hd..(nq + nkv) * hd]);
                assert!(
                    q_err < bound && k_err < bound,
                    "{style:?} hd{hd} rotating {rotary}: token {t}: {q_err} {k_err}"
                );
                assert_eq!(
                    v_got[cache_row],
                    row[(nq + nkv) * hd..],
                    "values are copied exactly"
                );
                // The values and keys of the token stay where they were in its row.
                assert_eq!(
                    q_got[t * width + nq * hd..(t + 1) * width],
                    qkv32[t * width + nq * hd..(t + 1) * width]
                );
            }
            // Nothing outside the step's slots is written.
            let written: std::collections::HashSet<usize> =
                tables.slots.iter().map(|s| *s as usize).collect();
            for slot in (0..cache / (nkv * hd)).filter(|s| !written.contains(s)) {
                assert!(k_got[slot * nkv * hd..(slot + 1) * nkv * hd]
                    .iter()
                    .all(|x| *x == 0.0));
            }
        }
    }
}

#[test]
fn rope_and_kv_write_bf16() {
    rope_and_kv_write::<bf16>(1e-2);
}

#[test]
fn rope_and_kv_write_f16() {
    rope_and_kv_write::<f16>(2e-3);
}

/// The largest difference, relative where the reference exceeds 1 in magnitude: the
/// outputs are rounded to 16 bits, so their error grows with their size.
fn max_scaled_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f32::max)
}

#[test]
fn silu_and_gelu_times_up() {
    let mut rng = Lcg(5);
    let (rows, width) = (37, 300);
    let values: Vec<f32> = rng
        .values(rows * 2 * width)
        .iter()
        .map(|v| 4.0 * v)
        .collect();
    for gate in [Gate::Silu, Gate::GeluTanh] {
        let (gu, gu32) = rounded::<bf16>(&values);
        let want = reference::gated(&gu32, width, gate);
        let err = max_scaled_diff(&to_f32(&gated_mul(&gu, width, gate).expect("runs")), &want);
        assert!(err < 1e-2, "{gate:?} bf16: {err}");
        let (gu, gu32) = rounded::<f16>(&values);
        let want = reference::gated(&gu32, width, gate);
        let err = max_scaled_diff(&to_f32(&gated_mul(&gu, width, gate).expect("runs")), &want);
        assert!(err < 2e-3, "{gate:?} f16: {err}");
    }
    // The two activations differ by far more than the bound: the kernel name picks one.
    let (gu, _) = rounded::<f16>(&values);
    let silu = to_f32(&gated_mul(&gu, width, Gate::Silu).expect("runs"));
    let gelu = to_f32(&gated_mul(&gu, width, Gate::GeluTanh).expect("runs"));
    assert!(max_abs_diff(&silu, &gelu) > 0.1);
}

/// gpt-oss's gate with its alpha 1.702 and a limit of 7, on values up to ±10 so that
/// both clamps bend a share of them; a kernel without either clamp fails the bound.
#[test]
fn clamped_swiglu_gate() {
    let mut rng = Lcg(23);
    let (rows, width) = (19, 320);
    let values: Vec<f32> = rng
        .values(rows * 2 * width)
        .iter()
        .map(|v| 10.0 * v)
        .collect();
    let (alpha, limit) = (1.702, 7.0);
    let (gu, gu32) = rounded::<bf16>(&values);
    let got = to_f32(&clamped_swiglu_mul(&gu, width, alpha, limit).expect("runs"));
    let err = max_scaled_diff(&got, &reference::clamped_gated(&gu32, width, alpha, limit));
    assert!(err < 1e-2, "bf16: {err}");
    let (gu, gu32) = rounded::<f16>(&values);
    let got = to_f32(&clamped_swiglu_mul(&gu, width, alpha, limit).expect("runs"));
    let want = reference::clamped_gated(&gu32, width, alpha, limit);
    let err = max_scaled_diff(&got, &want);
    assert!(err < 2e-3, "f16: {err}");
    let unclamped = reference::clamped_gated(&gu32, width, alpha, 1e9);
    assert!(max_scaled_diff(&got, &unclamped) > 0.5);
    // The gate's clamp alone (up kept within ±limit by a larger limit on it) also shows.
    let wide = to_f32(&clamped_swiglu_mul(&gu, width, alpha, 9.0).expect("runs"));
    assert!(max_scaled_diff(&got, &wide) > 0.1);
}

#[test]
fn residual_add_and_rms_norm() {
    let mut rng = Lcg(17);
    // Rows held in registers (4096, 5120), wider than the registers hold (20000), and
    // not a multiple of 4 wide (1001: the scalar path).
    for (rows, cols) in [(1, 4096), (7, 384), (2, 5120), (2, 20000), (2, 1001)] {
        let x: Vec<f32> = rng.values(rows * cols).iter().map(|v| 3.0 * v).collect();
        let d = rng.values(rows * cols);
        let w: Vec<f32> = rng.values(cols).iter().map(|v| 1.0 + 0.1 * v).collect();
        for delta in [None, Some(&d[..])] {
            let (sum, h) = add_rms_norm::<bf16>(&x, delta, &w, 1e-5).expect("runs");
            let (want_sum, want_h) = reference::add_rms_norm(&x, delta, &w, 1e-5);
            assert_eq!(sum, want_sum, "{rows}x{cols}: the sum is exact");
            let err = max_abs_diff(&to_f32(&h), &want_h);
            assert!(err < 2e-2, "{rows}x{cols} delta {}: {err}", delta.is_some());
        }
    }
}

#[test]
fn argmax_of_rows_lowest_index_on_ties() {
    let mut rng = Lcg(23);
    for (rows, cols) in [(1, 128_256), (3, 10_000), (3, 1000), (2, 5)] {
        let mut logits = rng.values(rows * cols);
        // Ties for the maximum in some rows, across the blocks a row is split over.
        for r in (0..rows).step_by(2) {
            let (a, b) = (rng.below(cols), rng.below(cols));
            logits[r * cols + a] = 7.0;
            logits[r * cols + b] = 7.0;
        }
        let want: Vec<u32> = logits
            .chunks(cols)
            .map(tessera_engine::sampler::argmax)
            .collect();
        assert_eq!(
            argmax_rows(&logits, cols).expect("runs"),
            want,
            "{rows}x{cols}"
        );
    }
    // NaN loses to every number; a row of NaN gives 0.
    let row = [f32::NAN, -1.0, f32::NAN, -0.5, f32::NAN];
    assert_eq!(argmax_rows(&row, 5).expect("runs"), vec![3]);
    assert_eq!(argmax_rows(&[f32::NAN; 4], 4).expect("runs"), vec![0]);
}

#[test]
fn sampling_candidates_are_the_host_samplers() {
    use tessera_engine::sampler::sampling_candidates as host;
    use tessera_kernels_emulated::sampling_candidates;
    let mut rng = Lcg(29);
    let cols = 20_000;
    // Peaked rows (few candidates), flat rows (thousands), rows with NaN and -inf, and
    // temperatures from near-greedy to hot, several rows a launch.
    for spread in [40.0f32, 6.0, 0.3] {
        let mut logits: Vec<f32> = rng.values(4 * cols).iter().map(|v| spread * v).collect();
        logits[5] = f32::NAN;
        logits[cols + 9] = f32::NEG_INFINITY;
        let temps = [1.0, 0.7, 0.05, 1.5];
        let got = sampling_candidates(&logits, cols, &temps, 4096).expect("runs");
        for (r, t) in temps.iter().enumerate() {
            let want = host(&logits[r * cols..(r + 1) * cols], *t);
            match &got[r] {
                Some(c) => assert_eq!(c, &want, "spread {spread} row {r}"),
                // More than fit: the host takes the row.
                None => assert!(want.len() > 4096, "spread {spread} row {r}: {}", want.len()),
            }
        }
    }
    // A row with +inf or only NaN has no finite best: it is copied whole.
    let mut rows = vec![0.5f32; 8];
    rows[2] = f32::INFINITY;
    rows[4..].fill(f32::NAN);
    let got = sampling_candidates(&rows, 4, &[1.0, 1.0], 16).expect("runs");
    assert_eq!(got, vec![None, None]);
    // A small cap: the rows that overflow it come back as None, the others whole.
    let logits = [0.0f32, 0.1, 0.2, 0.3, 9.0, -30.0, -8.0, -20.0];
    let got = sampling_candidates(&logits, 4, &[1.0, 1.0], 2).expect("runs");
    assert_eq!(got, vec![None, Some(vec![(0, 9.0), (2, -8.0)])]);
    // A row at temperature 0 (greedy, or copied whole) is skipped.
    let got = sampling_candidates(&logits, 4, &[1.0, 0.0], 8).expect("runs");
    assert_eq!(got[0].as_ref().map(Vec::len), Some(4));
    assert_eq!(got[1], None);
}

#[test]
fn row_log_sum_exp_is_the_rows() {
    use tessera_kernels_emulated::row_log_sum_exp;
    let mut rng = Lcg(31);
    // Rows wider than one block (many partials) and narrower, peaked and flat, with
    // -inf entries (which add nothing), against an f64 sum.
    for (cols, spread) in [(20_000usize, 30.0f32), (20_000, 0.5), (1000, 8.0), (3, 1.0)] {
        let mut logits: Vec<f32> = rng.values(3 * cols).iter().map(|v| spread * v).collect();
        logits[cols + 1] = f32::NEG_INFINITY;
        let got = row_log_sum_exp(&logits, cols).expect("runs");
        for (r, row) in logits.chunks_exact(cols).enumerate() {
            let want = row.iter().map(|l| f64::from(*l).exp()).sum::<f64>().ln();
            let err = (f64::from(got[r]) - want).abs();
            assert!(
                err < 1e-4 * want.abs().max(1.0),
                "cols {cols} row {r}: {} against {want}",
                got[r]
            );
        }
    }
    // No finite best (+inf, or only NaN), or a NaN among finite values: NaN, as the
    // host's log-sum-exp of such a row.
    let rows = [
        0.5f32,
        f32::INFINITY,
        0.1,
        f32::NAN,
        f32::NAN,
        f32::NAN,
        1.0,
        f32::NAN,
        2.0,
    ];
    let got = row_log_sum_exp(&rows, 3).expect("runs");
    assert!(got.iter().all(|l| l.is_nan()), "{got:?}");
}
