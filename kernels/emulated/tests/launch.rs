//! The generic launch checks a call against the kernel's own signature before it runs:
//! the engine's argument lists are refused when they miss an argument, add one, or pass
//! one of the wrong width — the mistakes a CUDA launch would turn into garbage.

use tessera_kernels::gpu::launch::{gated_shape, KernelArg};
use tessera_kernels_emulated::{launch, EmuError};

fn silu(args: &[KernelArg]) -> Result<(), EmuError> {
    // SAFETY: every call below is refused before the kernel runs, or (the last) runs on
    // live buffers of the stated sizes.
    unsafe { launch("silu_mul_bf16", gated_shape(4), args) }
}

#[test]
fn a_launch_must_match_the_kernel_signature() {
    let (mut out, gate_up) = ([half::bf16::ZERO; 4], [half::bf16::ONE; 8]);
    let (o, g) = (
        KernelArg::Ptr(out.as_mut_ptr() as u64),
        KernelArg::Ptr(gate_up.as_ptr() as u64),
    );
    let missing = silu(&[o, g, KernelArg::I32(4)]);
    assert!(
        matches!(missing, Err(EmuError::Arguments(_))),
        "{missing:?}"
    );
    let extra = silu(&[
        o,
        g,
        KernelArg::I32(4),
        KernelArg::Usize(4),
        KernelArg::I32(0),
    ]);
    assert!(matches!(extra, Err(EmuError::Arguments(_))), "{extra:?}");
    // `total` is a size_t: a 32-bit value in its place is refused.
    let narrow = silu(&[o, g, KernelArg::I32(4), KernelArg::I32(4)]);
    assert!(matches!(narrow, Err(EmuError::Arguments(_))), "{narrow:?}");
    // SAFETY: as above.
    let unknown = unsafe { launch("silu_mul_bf17", gated_shape(4), &[o, g]) };
    assert_eq!(
        unknown,
        Err(EmuError::UnknownKernel("silu_mul_bf17".into()))
    );

    silu(&[o, g, KernelArg::I32(4), KernelArg::Usize(4)]).expect("a matching launch runs");
    // SiLU(1) · 1 = 1 / (1 + e^-1).
    let want = 1.0 / (1.0 + (-1f32).exp());
    assert!(
        out.iter().all(|v| (v.to_f32() - want).abs() < 4e-3),
        "{out:?}"
    );
}
