//! The hybrid KV allocator (`--disable-hybrid-kv-cache-manager` turns it off) on models
//! that mix sliding-window and full-attention layers: the gemma2, gemma3, gpt-oss and
//! olmo3 fixtures (window 8) and the real Gemma-3-270M (window 512).
//!
//! Each model's greedy text with hybrid groups equals its text with one group (and
//! transformers' where the fixture's top two logits are apart), served by the scheduler
//! from a cache too small for the requests unless the sliding groups release their
//! blocks behind the window and reuse them, on CPU ranks at TP = 1 and 2 and on the
//! emulated GPU path; every block comes back. And the block counts: Gemma-3-270M at an
//! 8k context holds at least 4× the sequences in the same KV memory.

mod common;

use std::path::{Path, PathBuf};

use common::engine_loop::{idle_metrics, run_concurrently};
use common::reference::greedy_cases;
use serde_json::Value;
use tessera_engine::{generate, test_models, Engine, EngineConfig, GenerateOptions};
use tessera_protocol::{Executor, KvCacheShape, SamplingParams, SeqId};
use tessera_scheduler::{EngineLoop, KvCacheManager, PrefixHit, SchedulerConfig};

const MAX_TOKENS: usize = 16;
const BLOCK: usize = 4;
const FAMILIES: [&str; 4] = ["tiny-gemma2", "tiny-gemma3", "tiny-gpt-oss", "tiny-olmo3"];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(name)
}

#[derive(Clone, Copy)]
struct Setup {
    tp: usize,
    hybrid: bool,
    gpu: bool,
    block: usize,
}

fn config(path: &Path, s: Setup, kv_cache_bytes: usize) -> EngineConfig {
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(s.tp);
    cfg.block_size_tokens = s.block;
    cfg.kv_cache_bytes = kv_cache_bytes;
    cfg.hybrid_kv_cache = s.hybrid;
    cfg.emulate_gpu = s.gpu;
    cfg
}

/// An engine whose cache holds `blocks` blocks (measured from a 64 MiB one).
fn engine_of_blocks(path: &Path, s: Setup, blocks: usize) -> Engine {
    let probe = 64 << 20;
    let measured = Engine::load(&config(path, s, probe)).expect("engine");
    let block_bytes = probe / measured.kv_cache_shape().num_blocks;
    drop(measured);
    let engine = Engine::load(&config(path, s, blocks * block_bytes)).expect("engine");
    assert_eq!(engine.kv_cache_shape().num_blocks, blocks);
    engine
}

fn greedy_alone(engine: &mut Engine, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let opts = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop_token_ids: vec![],
        prefill_chunk: 0,
    };
    prompts
        .iter()
        .map(|p| generate(engine, p, &opts, |_| {}).expect("generate"))
        .collect()
}

/// Blocks a hybrid cache needs for one request of `longest` tokens in chunks of `chunk`,
/// with a little room: the full groups hold every block, each sliding group its window
/// and a chunk.
fn one_request_blocks(shape: &KvCacheShape, longest: usize, chunk: usize) -> usize {
    let bs = shape.block_size_tokens;
    let window = shape.attention_window.expect("a window");
    let groups = shape.hybrid.expect("hybrid groups");
    groups.full * (longest.div_ceil(bs) + 1) + groups.sliding * ((window + chunk + bs) / bs + 1)
}

/// Serves every prompt twice, all at once, from `small` under the scheduler (chunks of
/// `chunk` tokens, so requests preempt one another too): each gets `alone`'s text, and
/// every block comes back. `small` is too small to hold one request in every group, so
/// the sliding groups must give blocks back as they go.
fn serve_twice_from(
    small: Engine,
    prompts: &[Vec<u32>],
    alone: &[Vec<u32>],
    max_tokens: usize,
    chunk: usize,
    what: &str,
) {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + max_tokens;
    let shape = small.kv_cache_shape();
    assert!(shape.hybrid.is_some(), "{what}: {shape:?}");
    assert!(
        shape.num_blocks < shape.num_groups() * longest.div_ceil(shape.block_size_tokens),
        "{what}: {shape:?} holds the longest request without releasing"
    );
    let handle = EngineLoop::spawn(
        SchedulerConfig {
            block_size_tokens: shape.block_size_tokens,
            max_batch_tokens: chunk,
            max_num_seqs: 4,
            ..SchedulerConfig::default()
        },
        small,
    )
    .expect("engine loop");
    let twice: Vec<Vec<u32>> = prompts.iter().chain(prompts).cloned().collect();
    let got = run_concurrently(&handle, &twice, max_tokens);
    for (i, (got, want)) in got.iter().zip(alone.iter().chain(alone)).enumerate() {
        assert_eq!(got, want, "{what}: request {i}");
    }
    let m = idle_metrics(&handle);
    assert_eq!(m.kv_blocks_in_use, 0, "{what}: blocks left held");
    handle.shutdown();
    handle.join().expect("loop");
}

/// One family on CPU ranks: hybrid text equals one group's and the references, alone
/// and served from a small cache at TP = 1 and 2.
fn family_on_cpu(name: &str) {
    let path = fixture(name);
    let cases = greedy_cases(&fixture(name));
    let prompts: Vec<Vec<u32>> = cases.iter().map(|(p, _)| p.clone()).collect();
    let s = |tp, hybrid| Setup {
        tp,
        hybrid,
        gpu: false,
        block: BLOCK,
    };
    let one_group = greedy_alone(
        &mut Engine::load(&config(&path, s(1, false), 64 << 20)).expect("engine"),
        &prompts,
        MAX_TOKENS,
    );
    let mut roomy = Engine::load(&config(&path, s(1, true), 64 << 20)).expect("engine");
    assert!(roomy.kv_cache_shape().hybrid.is_some(), "{name}");
    let hybrid = greedy_alone(&mut roomy, &prompts, MAX_TOKENS);
    assert_eq!(hybrid, one_group, "{name}: hybrid groups against one group");
    for ((_, want), got) in cases.iter().zip(&hybrid) {
        if let Some(want) = want {
            assert_eq!(got, want, "{name}: against transformers");
        }
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + MAX_TOKENS;
    let blocks = one_request_blocks(&roomy.kv_cache_shape(), longest, 8);
    drop(roomy);
    for tp in [1, 2] {
        serve_twice_from(
            engine_of_blocks(&path, s(tp, true), blocks),
            &prompts,
            &one_group,
            MAX_TOKENS,
            8,
            &format!("{name} tp={tp}"),
        );
    }
}

#[test]
fn gemma2_hybrid_text_equals_one_group_from_a_small_cache() {
    family_on_cpu(FAMILIES[0]);
}

#[test]
fn gemma3_hybrid_text_equals_one_group_from_a_small_cache() {
    family_on_cpu(FAMILIES[1]);
}

#[test]
fn gpt_oss_hybrid_text_equals_one_group_from_a_small_cache() {
    family_on_cpu(FAMILIES[2]);
}

#[test]
fn olmo3_hybrid_text_equals_one_group_from_a_small_cache() {
    family_on_cpu(FAMILIES[3]);
}

/// Every family's architecture in head dimensions the CUDA kernels serve, random
/// weights, on the emulated GPU path: hybrid text from a small cache equals one group's.
#[test]
fn the_gpu_path_reads_each_layer_through_its_groups_table() {
    for name in FAMILIES {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hybrid-kv-{name}"));
        let dims = test_models::gpu_shaped(name).expect("dimensions");
        test_models::write(&fixture(name), &out, &dims, 20261128).expect("random model");
        let prompts: Vec<Vec<u32>> = greedy_cases(&fixture(name))
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let s = |hybrid| Setup {
            tp: 1,
            hybrid,
            gpu: true,
            block: BLOCK,
        };
        let one_group = greedy_alone(
            &mut Engine::load(&config(&out, s(false), 64 << 20)).expect("engine"),
            &prompts,
            MAX_TOKENS,
        );
        let mut roomy = Engine::load(&config(&out, s(true), 64 << 20)).expect("engine");
        let hybrid = greedy_alone(&mut roomy, &prompts, MAX_TOKENS);
        assert_eq!(
            hybrid, one_group,
            "{name} gpu path: hybrid against one group"
        );
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + MAX_TOKENS;
        let blocks = one_request_blocks(&roomy.kv_cache_shape(), longest, 8);
        drop(roomy);
        serve_twice_from(
            engine_of_blocks(&out, s(true), blocks),
            &prompts,
            &one_group,
            MAX_TOKENS,
            8,
            &format!("{name} gpu path"),
        );
    }
}

/// The real Gemma 3 270M as `scripts/fetch-gemma3` places it; missing, the tests that
/// need it say so and pass, unless `TESSERA_REQUIRE_FIXTURES=1`.
fn gemma3_270m() -> Option<PathBuf> {
    let p = tessera_engine::default_model_path().with_file_name("gemma-3-270m-q4_k_m.gguf");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("TESSERA_REQUIRE_FIXTURES").is_none_or(|v| v != "1"),
        "{} is missing: run scripts/fetch-gemma3",
        p.display()
    );
    eprintln!("skipped: {} is missing", p.display());
    None
}

/// Two prompts past the 512-token window (token ids of the fixture's prompts, repeated),
/// so the sliding layers' early blocks fall behind it.
fn long_prompts() -> Vec<Vec<u32>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models/gemma3_270m/transformers.json");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir).expect("fixture")).expect("json");
    let ids: Vec<Vec<u32>> = reference["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            c["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|t| t.as_u64().expect("id") as u32)
                .collect()
        })
        .collect();
    (0..2)
        .map(|k| {
            // `<bos>` once, then the other prompts' text in turn.
            let mut p = vec![ids[k][0]];
            let body = ids
                .iter()
                .cycle()
                .skip(k)
                .flat_map(|c| c[1..].iter().copied());
            p.extend(body.take(600 + 40 * k));
            p
        })
        .collect()
}

#[test]
fn gemma3_270m_hybrid_text_equals_one_group_past_its_window() {
    let Some(path) = gemma3_270m() else {
        return;
    };
    let prompts = long_prompts();
    let max_tokens = 8;
    let s = |hybrid| Setup {
        tp: 1,
        hybrid,
        gpu: false,
        block: 16,
    };
    let one_group = greedy_alone(
        &mut Engine::load(&config(&path, s(false), 256 << 20)).expect("engine"),
        &prompts,
        max_tokens,
    );
    let shape = Engine::load(&config(&path, s(true), 16 << 20))
        .expect("engine")
        .kv_cache_shape();
    assert_eq!(
        (
            shape.hybrid.map(|h| (h.full, h.sliding)),
            shape.attention_window
        ),
        (Some((1, 5)), Some(512))
    );
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + max_tokens;
    let blocks = one_request_blocks(&shape, longest, 64);
    serve_twice_from(
        engine_of_blocks(&path, s(true), blocks),
        &prompts,
        &one_group,
        max_tokens,
        64,
        "gemma-3-270m",
    );
}

/// How many sequences of `context` tokens, prefilled in chunks of `chunk`, a cache of
/// `shape` holds at once (each releasing behind its window after every chunk).
fn concurrent_sequences(shape: KvCacheShape, context: usize, chunk: usize) -> usize {
    let mut kv = KvCacheManager::for_shape(shape, false);
    let mut held = 0;
    'next: loop {
        let seq = SeqId(held as u64);
        if kv.allocate(seq, &PrefixHit::default(), 0).is_err() {
            break;
        }
        let mut pos = 0;
        while pos < context {
            let end = (pos + chunk).min(context);
            if kv.grow(seq, end).is_err() {
                kv.free(seq);
                break 'next;
            }
            pos = end;
            kv.release_behind_window(seq, pos);
        }
        held += 1;
    }
    kv.check_invariants().expect("invariants");
    held
}

#[test]
fn gemma3_270m_holds_four_times_the_8k_sequences_in_the_same_memory() {
    let Some(path) = gemma3_270m() else {
        return;
    };
    let (context, chunk) = (8192, 512);
    // Eight 8k sequences of one group in f32: 18 layers of K and V, one KV head of 256.
    let bytes = 8 * (context / 16) * 18 * 2 * 256 * 4 * 16;
    let s = |hybrid| Setup {
        tp: 1,
        hybrid,
        gpu: false,
        block: 16,
    };
    let one = Engine::load(&config(&path, s(false), bytes))
        .expect("engine")
        .kv_cache_shape();
    let hybrid = Engine::load(&config(&path, s(true), bytes))
        .expect("engine")
        .kv_cache_shape();
    // A hybrid block holds 3 layers' KV, one group's 18: six times the blocks.
    assert_eq!(hybrid.num_blocks, 6 * one.num_blocks);
    let (n_one, n_hybrid) = (
        concurrent_sequences(one, context, chunk),
        concurrent_sequences(hybrid, context, chunk),
    );
    println!(
        "gemma-3-270m, 8k context, {} MiB of f32 KV: {n_one} sequences with one group \
         ({} blocks), {n_hybrid} with hybrid groups ({} blocks)",
        bytes >> 20,
        one.num_blocks,
        hybrid.num_blocks
    );
    assert_eq!(n_one, 8);
    assert!(n_hybrid >= 4 * n_one, "{n_hybrid} against {n_one}");
}
