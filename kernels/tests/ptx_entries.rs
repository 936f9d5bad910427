//! With the `cuda` feature (CI builds the PTX with nvcc but has no GPU): every kernel the
//! launch planner can name is an entry of the PTX it loads, so no launch can ask a device
//! for a kernel that was never compiled.
#![cfg(feature = "cuda")]

use tessera_kernels::gpu::launch::{
    attention_kernel, merge_kernel, KvDtype, ARGMAX_KERNEL, CANDIDATES_KERNEL, EXP_SUMS_KERNEL,
    HEAD_DIMS, PREFILL_TILE,
};
use tessera_kernels::gpu::moe::{moe_matvec_kernels, MOE_COMBINE_KERNEL, MOE_ROUTE_KERNEL};
use tessera_kernels::gpu::ptx;
use tessera_kernels::gpu::quant_matvec::{
    quant_matvec_kernel, quantize_act_kernel, ActDtype, GgufQuant, MAX_ROWS,
};
use tessera_kernels::gpu::quantized::{
    fp8_scales_kernel, kv_store_kernel, quantized_attention_kernel, KvQuant,
};

fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.split(".entry ").nth(1))
        .map(|rest| rest.trim_end_matches('(').trim())
        .collect()
}

#[test]
fn every_kernel_the_planner_names_is_compiled() {
    let attention = entries(ptx::ATTENTION);
    for dtype in [KvDtype::Bf16, KvDtype::F16] {
        for hd in HEAD_DIMS {
            for tile in [1, PREFILL_TILE] {
                let name = attention_kernel(dtype, hd, tile);
                assert!(attention.contains(&name.as_str()), "{name} missing");
                for quant in [KvQuant::Int8, KvQuant::Fp8] {
                    let name = quantized_attention_kernel(dtype, quant, hd, tile);
                    assert!(attention.contains(&name.as_str()), "{name} missing");
                }
            }
            let name = merge_kernel(dtype, hd);
            assert!(attention.contains(&name.as_str()), "{name} missing");
        }
        let kv_write = entries(ptx::KV_WRITE);
        for name in [
            kv_store_kernel(dtype, KvQuant::Int8),
            kv_store_kernel(dtype, KvQuant::Fp8),
            fp8_scales_kernel(dtype),
        ] {
            assert!(kv_write.contains(&name.as_str()), "{name} missing");
        }
        for (module, name) in [
            (ptx::KV_WRITE, "rope_write_kv"),
            (ptx::ACTIVATIONS, "silu_mul"),
            (ptx::ACTIVATIONS, "gelu_tanh_mul"),
            (ptx::ACTIVATIONS, "clamped_swiglu_mul"),
            (ptx::NORM, "add_rms_norm"),
        ] {
            let name = format!("{name}_{}", dtype.suffix());
            assert!(entries(module).contains(&name.as_str()), "{name} missing");
        }
    }
    assert!(entries(ptx::ARGMAX).contains(&ARGMAX_KERNEL));
    assert!(entries(ptx::CANDIDATES).contains(&CANDIDATES_KERNEL));
    assert!(entries(ptx::CANDIDATES).contains(&EXP_SUMS_KERNEL));
    // 2 dtypes x 5 head dims x (2 tiles x (16-bit, int8, fp8 caches) + merge).
    assert_eq!(attention.len(), 70);
}

#[test]
fn every_mixture_of_experts_kernel_is_compiled() {
    let module = entries(ptx::MOE);
    let mut names = moe_matvec_kernels();
    names.extend([MOE_ROUTE_KERNEL.to_string(), MOE_COMBINE_KERNEL.to_string()]);
    for name in &names {
        assert!(module.contains(&name.as_str()), "{name} missing");
    }
    assert_eq!(module.len(), names.len());
}

#[test]
fn every_quantized_matvec_is_compiled() {
    let module = entries(ptx::QUANT_MATVEC);
    for dtype in [ActDtype::F32, ActDtype::Bf16] {
        let name = quantize_act_kernel(dtype);
        assert!(module.contains(&name.as_str()), "{name} missing");
    }
    for quant in GgufQuant::ALL {
        for rows in 1..=MAX_ROWS {
            let name = quant_matvec_kernel(quant, rows);
            assert!(module.contains(&name.as_str()), "{name} missing");
        }
    }
    // 2 quantize kernels, 6 types x 8 row counts.
    assert_eq!(module.len(), 2 + 6 * MAX_ROWS);
}

#[test]
fn the_ptx_targets_a_version_the_gpu_driver_loads() {
    // nvcc 13.0 writes PTX ISA 9.0, which driver 580 (CUDA 13.0) loads; a newer
    // toolkit's PTX would be refused by that driver at module load.
    for module in [
        ptx::ATTENTION,
        ptx::KV_WRITE,
        ptx::ACTIVATIONS,
        ptx::NORM,
        ptx::ARGMAX,
        ptx::CANDIDATES,
        ptx::QUANT_MATVEC,
    ] {
        let version = module
            .lines()
            .find_map(|l| l.strip_prefix(".version "))
            .unwrap_or_default();
        assert_eq!(version.trim(), "9.0", "PTX ISA version");
    }
}
