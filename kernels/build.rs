//! Compiles the CUDA kernels in `cuda/` to PTX with nvcc when the `cuda` feature is on.
//!
//! nvcc comes from `$CUDA_HOME/bin` or the PATH. The PTX targets
//! `compute_$CUDA_COMPUTE_CAP` (default 80: the bf16 instructions the kernels use need
//! it; the driver compiles PTX for newer GPUs at load). A kernel that does not compile
//! fails the build: the engine never loads a kernel module that is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: [&str; 8] = [
    "attention",
    "kv_write",
    "activations",
    "norm",
    "argmax",
    "candidates",
    "quant_matvec",
    "moe",
];

fn main() {
    println!("cargo:rerun-if-changed=cuda");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC_CCBIN");
    let cap = std::env::var("CUDA_COMPUTE_CAP")
        .ok()
        .map(|c| c.trim().replace('.', ""))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "80".into());
    // The engine refuses, at open, a GPU older than the kernels target.
    println!("cargo:rustc-env=TESSERA_CUDA_COMPUTE_CAP={cap}");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = match std::env::var_os("CUDA_HOME") {
        Some(home) => Path::new(&home).join("bin").join("nvcc"),
        None => PathBuf::from("nvcc"),
    };
    for name in SOURCES {
        let src = Path::new("cuda").join(format!("{name}.cu"));
        let ptx = out.join(format!("{name}.ptx"));
        let mut cmd = Command::new(&nvcc);
        cmd.arg("--ptx")
            .arg(format!("-arch=compute_{cap}"))
            .args(["-O3", "-std=c++17", "-Icuda"])
            .arg("-o")
            .arg(&ptx)
            .arg(&src);
        if let Ok(ccbin) = std::env::var("NVCC_CCBIN") {
            cmd.arg("-ccbin").arg(ccbin);
        }
        let status = cmd.status().unwrap_or_else(|e| {
            panic!(
                "cannot run {} to compile {}: {e} (set CUDA_HOME or put nvcc on the PATH; \
                 scripts/build-gpu installs a toolkit)",
                nvcc.display(),
                src.display()
            )
        });
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
}
