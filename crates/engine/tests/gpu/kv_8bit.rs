//! 8-bit KV caches on the device: the store kernels (int8 with a scale per block and KV
//! head, fp8 E4M3 with a scale per KV head) against the host reference of the CPU ranks'
//! write (`tessera_kernels::gpu::quantized::QuantizedCache::store`), over two steps so
//! int8 blocks grow their scales and requantize earlier entries; then paged attention
//! over what the device stored against the plain reference over the same entries
//! dequantized on the host.

use candle_core::{DType, Device, Tensor};
use tessera_engine::device::dtype::candle_dtype;
use tessera_engine::model::batch::Batch;
use tessera_engine::model::cuda::kernels::{
    paged_attention, HeadLayout, LayerAttention, RopeTables,
};
use tessera_engine::model::cuda::kv_store::write_kv;
use tessera_engine::model::cuda::step_meta::StepMeta;
use tessera_engine::model::cuda::CudaKvCache;
use tessera_engine::model::step_meta::PackedMeta;
use tessera_kernels::gpu::launch::{KvDtype, HEAD_DIMS};
use tessera_kernels::gpu::quantized::{KvQuant, QuantizedCache};
use tessera_kernels::gpu::reference::{
    self, max_row_relative_diff, scattered, AttentionInput, StepSeq, SHARP_SCORES,
};

use crate::kernels::{launcher, TARGET_BLOCKS};
use crate::report::{check, download, gpu, rounded, upload, Lcg};

/// RoPE tables that rotate nothing (cos 1, sin 0): the stored keys are the input's.
fn identity_rope(positions: usize, hd: usize, device: &Device) -> RopeTables {
    let n = positions * hd / 2;
    RopeTables {
        cos: Tensor::ones(n, DType::F32, device)
            .and_then(|t| t.reshape((positions, hd / 2)))
            .expect("cos"),
        sin: Tensor::zeros((positions, hd / 2), DType::F32, device).expect("sin"),
        interleaved: false,
        rotary_half: hd / 2,
    }
}

/// One case's figures: the share of stored bytes unlike the reference's, the largest
/// relative difference of a scale, and attention's largest row error.
fn case(
    quant: KvQuant,
    hd: usize,
    (nq, nkv, bs): (usize, usize, usize),
    rng: &mut Lcg,
) -> (f64, f32, f32) {
    let device = gpu();
    let act = KvDtype::Bf16;
    let dt = candle_dtype(act);
    // Two steps of each sequence (tokens of the first, then of the second): prefills in
    // chunks, a decode, and a sequence whose second step starts mid-block.
    let lens = [(37, 21), (5, 1), (16, 3), (1, 1)];
    let (tables, num_blocks) = scattered(
        &lens.iter().map(|(a, b)| (0, a + b)).collect::<Vec<_>>(),
        bs,
        rng,
    );
    let mut cache =
        CudaKvCache::new(&device, 1, num_blocks, bs, nkv, hd, act, quant.dtype()).expect("cache");
    let mut want_k = QuantizedCache::new(quant, num_blocks, bs, nkv, hd);
    let mut want_v = want_k.clone();
    let kv_of_q: Vec<u32> = (0..nq).map(|h| (h / (nq / nkv)) as u32).collect();
    let heads = HeadLayout {
        num_q_heads: nq,
        num_kv_heads: nkv,
        head_dim: hd,
    };
    let width = heads.qkv_width();
    let rope = identity_rope(64, hd, &device);
    let mut last = None;
    for step in 0..2 {
        let steps: Vec<StepSeq> = tables
            .iter()
            .zip(&lens)
            .map(|(t, (a, b))| StepSeq {
                start_pos: if step == 0 { 0 } else { *a },
                num_tokens: if step == 0 { *a } else { *b },
                block_table: t.block_table.clone(),
            })
            .collect();
        let batch = Batch::of_steps(&steps, bs);
        let n = batch.num_tokens();
        // Values of a few sizes, so int8 blocks' scales grow from step to step.
        let grow = 1.0 + 3.0 * step as f32;
        let qkv: Vec<f32> = rounded(&rng.values(n * width), dt)
            .iter()
            .map(|x| x * grow)
            .collect();
        let qkv = rounded(&qkv, dt);
        let qkv_dev = upload(&qkv, &[n, width], dt, &device);
        let packed = PackedMeta::new(&batch, &kv_of_q, TARGET_BLOCKS).expect("pack");
        let meta = StepMeta::upload(packed, bs, &device).expect("upload");
        write_kv(
            launcher(&device),
            act,
            &qkv_dev,
            &mut cache,
            0,
            &meta,
            &rope,
            heads,
        )
        .expect("store");
        let rows = |first: usize| -> Vec<f32> {
            (0..n)
                .flat_map(|t| qkv[t * width + first * hd..t * width + (first + nkv) * hd].to_vec())
                .collect()
        };
        let slots: Vec<usize> = batch.slots.clone();
        want_k.store(&rows(nq), &slots);
        want_v.store(&rows(nq + nkv), &slots);
        last = Some((qkv, qkv_dev, meta, steps));
    }
    let Some((qkv, qkv_dev, meta, steps)) = last else {
        unreachable!("two steps ran")
    };
    let layer = cache.layer(0).expect("layer 0");
    let bytes = |t: &Tensor| {
        t.flatten_all()
            .and_then(|t| t.to_vec1::<u8>())
            .expect("bytes")
    };
    let Some((_, ks, vs)) = layer.quant else {
        unreachable!("an 8-bit cache")
    };
    let stored = |b: Vec<u8>, s: &Tensor, proto: &QuantizedCache| QuantizedCache {
        bytes: b,
        scales: s.to_vec1::<f32>().expect("scales"),
        ..proto.clone()
    };
    let got_k = stored(bytes(layer.k), ks, &want_k);
    let got_v = stored(bytes(layer.v), vs, &want_v);
    let mut differ = 0;
    let mut scale_err = 0f32;
    for (got, want) in [(&got_k, &want_k), (&got_v, &want_v)] {
        differ += got
            .bytes
            .iter()
            .zip(&want.bytes)
            .filter(|(a, b)| a != b)
            .count();
        for (g, w) in got.scales.iter().zip(&want.scales) {
            scale_err = scale_err.max((g - w).abs() / w.abs().max(1e-30));
        }
    }
    let share = differ as f64 / (2 * want_k.bytes.len()) as f64;
    let scale = SHARP_SCORES / (hd as f32).sqrt();
    let out = paged_attention(
        launcher(&device),
        act,
        &qkv_dev,
        layer,
        &meta,
        heads,
        LayerAttention {
            window: None,
            scale,
            softcap: None,
            sinks: None,
        },
    )
    .expect("attention");
    let want = reference::attention(&AttentionInput {
        qkv: &qkv,
        k_cache: &got_k.dequantized(),
        v_cache: &got_v.dequantized(),
        seqs: &steps,
        num_q_heads: nq,
        num_kv_heads: nkv,
        head_dim: hd,
        block_size: bs,
        window: None,
        scale,
        softcap: None,
        sinks: None,
    });
    (
        share,
        scale_err,
        max_row_relative_diff(&download(&out), &want, hd),
    )
}

#[test]
fn kv_8_bit_store_and_attention_match_the_references() {
    let mut rng = Lcg(41);
    for quant in [KvQuant::Int8, KvQuant::Fp8] {
        for hd in HEAD_DIMS {
            for shape in [(4, 2, 16), (6, 1, 7)] {
                let (share, scale_err, err) = case(quant, hd, shape, &mut rng);
                let (nq, nkv, bs) = shape;
                check(
                    &format!(
                        "kv store {} hd{hd} {nq}q/{nkv}kv block {bs}, two steps",
                        quant.suffix()
                    ),
                    format!("{share:.1e} of entries and scales {scale_err:.1e} from the host's"),
                    "entries < 1e-3, scales < 1e-6".into(),
                    share < 1e-3 && scale_err < 1e-6,
                );
                check(
                    &format!(
                        "attention bf16 over {} hd{hd} {nq}q/{nkv}kv block {bs}",
                        quant.suffix()
                    ),
                    format!("max relative err {err:.2e}"),
                    "< 2e-2".into(),
                    err < 2e-2,
                );
            }
        }
    }
}
