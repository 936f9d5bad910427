//! Not checks: files `scripts/bench-gpu` makes with this binary, which it has on the GPU
//! machine (no Rust toolchain there).

use candle_core::quantized::GgmlDType;

use crate::gguf_writer::{write_gguf, GgufTypes, Vocab};

/// Not a check: writes the benchmark model in `TESSERA_BENCH_MODEL` (a safetensors
/// folder) next to it as a GGUF with its tokenizer, for scripts/bench-gpu:
/// `TESSERA_BENCH_GGUF` is `q4_1` (MODEL.q4_1.gguf), `q4_k_m` (llama.cpp's Q4_K_M mix) or
/// `bf16` (MODEL.bf16.gguf, the same weights unquantized, for llama.cpp's server).
#[test]
#[ignore = "run by scripts/bench-gpu"]
fn write_gguf_for_the_benchmarks() {
    let dir = std::path::PathBuf::from(
        std::env::var("TESSERA_BENCH_MODEL").expect("TESSERA_BENCH_MODEL"),
    );
    let kind = std::env::var("TESSERA_BENCH_GGUF").unwrap_or_else(|_| "q4_1".into());
    let types = match kind.as_str() {
        "q4_1" => GgufTypes::All(GgmlDType::Q4_1),
        "q4_k_m" => GgufTypes::Q4KM,
        "bf16" => GgufTypes::All(GgmlDType::BF16),
        other => panic!("TESSERA_BENCH_GGUF={other}: expected q4_1, q4_k_m or bf16"),
    };
    let out = dir.with_extension(format!("{kind}.gguf"));
    let started = std::time::Instant::now();
    write_gguf(&dir, types, Vocab::Embedded, &out);
    println!(
        "wrote {} in {:.1}s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
}
