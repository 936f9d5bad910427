//! 8-bit KV caches (`--kv-cache-dtype fp8` and `int8`) against a bf16 cache, on CPU ranks:
//! - the real SmolLM2 (Q4_1) and Gemma 3 270M (Q4_K_M) files over a long prompt (2048
//!   tokens of `tests/fixtures/text/long_prompt.txt`): how often the most likely next
//!   token is the bf16 run's, and the worst log-probability error on the bf16 run's five
//!   most likely tokens;
//! - greedy text from the fixtures' prompts and the long prompt's first 512 tokens: where
//!   it parts from the bf16 run's, bf16 itself nearly tied (how many stay equal is
//!   printed);
//! - the random-weight family fixtures over a long random prompt;
//! - the cache's capacity: the same budget holds about twice the blocks of bf16;
//! - `auto` on CPU ranks is one of the two 8-bit types held to these bounds.
//!
//! The bounds below were measured on this machine's build and left with room; a cache
//! that decoded a scale wrongly, or dropped one, moves the numbers by whole nats.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use tessera_engine::device::dtype::{KvCacheDtype, KvCacheDtypeChoice, CPU_AUTO_KV};
use tessera_engine::model::{Batch, ChunkLimits};
use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::{Executor, KvCacheShape, ScheduledChunk, SeqId, StepPlan};

const LONG_PROMPT_TOKENS: usize = 2048;
const EIGHT_BIT: [KvCacheDtype; 2] = [KvCacheDtype::Fp8E4m3, KvCacheDtype::Int8];

/// An engine over `path` whose cache stores `dtype` (the default budget of 256 MiB holds
/// a 2048-token sequence of both models in every type).
fn engine(path: &Path, dtype: KvCacheDtype) -> Engine {
    let mut cfg = EngineConfig::new(path);
    cfg.kv_cache_dtype = Some(KvCacheDtypeChoice::Fixed(dtype));
    Engine::load(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn gemma3_path() -> PathBuf {
    let p = tessera_engine::default_model_path().with_file_name("gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-gemma3",
        p.display()
    );
    p
}

/// The first `n` tokens of the long prompt, as `path`'s own tokenizer reads it.
fn long_prompt(path: &Path, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string(repo_root().join("tests/fixtures/text/long_prompt.txt"))
        .expect("long prompt");
    let tokenizer = tessera_engine::load_tokenizer(path).expect("tokenizer");
    let ids = tokenizer.encode(&text, true).expect("encode");
    assert!(ids.len() >= n, "the long prompt is {} tokens", ids.len());
    ids[..n].to_vec()
}

/// Logits after each of `rows` positions of `prompt`, run in chunks of `chunk` tokens (one
/// sequence in blocks 0, 1, ...), handed to `each` as `(position, logits)`.
fn each_position_logits(
    engines: &mut [Engine],
    prompt: &[u32],
    chunk: usize,
    every: usize,
    mut each: impl FnMut(usize, &[Vec<f32>]),
) {
    let bs = engines[0].kv_cache_shape().block_size_tokens;
    let table: Vec<u32> = (0..prompt.len().div_ceil(bs) as u32).collect();
    for start in (0..prompt.len()).step_by(chunk) {
        let end = (start + chunk).min(prompt.len());
        let rows: Vec<usize> = (start..end).filter(|p| p % every == every - 1).collect();
        let outs: Vec<Vec<f32>> = engines
            .iter_mut()
            .map(|e| {
                // Engines of different cache types may group their layers differently
                // (fp8 keeps one group): each gets its own groups' tables, after group 0's.
                let shape = e.kv_cache_shape();
                let n = table.len() as u32;
                let plan = StepPlan {
                    new_sequences: vec![],
                    scheduled: vec![ScheduledChunk {
                        id: SeqId(1),
                        tokens: prompt[start..end].to_vec(),
                        start_pos: start,
                        block_table: table.clone(),
                        sample: true,
                        num_draft: 0,
                        propose: 0,
                        group_tables: (1..shape.num_groups() as u32)
                            .map(|g| table.iter().map(|b| b + g * n).collect())
                            .collect(),
                    }],
                    finished: vec![],
                };
                let config = e.model_config();
                let limits = ChunkLimits {
                    kv: KvCacheShape {
                        hybrid: shape.hybrid,
                        ..KvCacheShape::new(shape.num_blocks, bs)
                    },
                    max_positions: config.max_position_embeddings,
                    vocab_rows: config.vocab_size,
                };
                let mut batch = Batch::from_plan(&plan, &limits).expect("batch");
                batch.sample_rows = rows.iter().map(|p| p - start).collect();
                e.forward(batch).expect("forward")
            })
            .collect();
        let vocab = outs[0].len() / rows.len().max(1);
        for (i, &p) in rows.iter().enumerate() {
            let per: Vec<Vec<f32>> = outs
                .iter()
                .map(|o| o[i * vocab..(i + 1) * vocab].to_vec())
                .collect();
            each(p, &per);
        }
    }
}

/// The index of the largest logit (the first of equals).
fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, b), (i, v)| {
            if *v > b {
                (i, *v)
            } else {
                (bi, b)
            }
        })
        .0
}

/// The five largest logits' indices, largest first (ties: the lower index first).
fn top5(x: &[f32]) -> [usize; 5] {
    let mut top = [(usize::MAX, f32::NEG_INFINITY); 5];
    for (i, &v) in x.iter().enumerate() {
        if v > top[4].1 {
            let at = top.iter().position(|(_, t)| v > *t).unwrap_or(4);
            top.copy_within(at..4, at + 1);
            top[at] = (i, v);
        }
    }
    top.map(|(i, _)| i)
}

/// `ln Σ e^x`, in f64.
fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
    max + x.iter().map(|v| (*v as f64 - max).exp()).sum::<f64>().ln()
}

/// How a run follows the reference run, position by position.
#[derive(Debug, Default, Clone, Copy)]
struct Agreement {
    positions: usize,
    top1_equal: usize,
    /// Over positions, the largest |log-probability error| on the reference's 5 most
    /// likely tokens; and its mean.
    worst_top5: f64,
    sum_top5: f64,
}

impl Agreement {
    fn add(&mut self, got: &[f32], reference: &[f32]) {
        self.positions += 1;
        let top = top5(reference);
        self.top1_equal += usize::from(argmax(got) == top[0]);
        let (lse, lse_ref) = (log_sum_exp(got), log_sum_exp(reference));
        let err = top
            .iter()
            .map(|&t| ((got[t] as f64 - lse) - (reference[t] as f64 - lse_ref)).abs())
            .fold(0f64, f64::max);
        self.worst_top5 = self.worst_top5.max(err);
        self.sum_top5 += err;
    }

    fn top1(&self) -> f64 {
        self.top1_equal as f64 / self.positions.max(1) as f64
    }

    fn mean_top5(&self) -> f64 {
        self.sum_top5 / self.positions.max(1) as f64
    }
}

impl std::fmt::Display for Agreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "top-1 equal at {}/{} positions ({:.2}%), top-5 log-prob error worst {:.4} mean {:.5} nats",
            self.top1_equal,
            self.positions,
            100.0 * self.top1(),
            self.worst_top5,
            self.mean_top5()
        )
    }
}

/// Each 8-bit type's agreement with a bf16 cache over `prompt` (every `every`-th
/// position).
fn against_bf16(path: &Path, prompt: &[u32], every: usize) -> Vec<(KvCacheDtype, Agreement)> {
    let mut engines: Vec<Engine> = [KvCacheDtype::Bf16]
        .iter()
        .chain(&EIGHT_BIT)
        .map(|d| engine(path, *d))
        .collect();
    let mut agreement = [Agreement::default(); EIGHT_BIT.len()];
    each_position_logits(&mut engines, prompt, 256, every, |_, logits| {
        for (a, got) in agreement.iter_mut().zip(&logits[1..]) {
            a.add(got, &logits[0]);
        }
    });
    let out: Vec<(KvCacheDtype, Agreement)> = EIGHT_BIT.iter().copied().zip(agreement).collect();
    for (d, a) in &out {
        println!("{}: {d} against bf16: {a}", path.display());
    }
    out
}

/// Bounds of an 8-bit cache against bf16 over the long prompt.
struct Bounds {
    min_top1: f64,
    max_worst_top5: f64,
    max_mean_top5: f64,
}

fn check_long_prompt(label: &str, path: &Path, every: usize, bounds: &[(KvCacheDtype, Bounds)]) {
    let prompt = long_prompt(path, LONG_PROMPT_TOKENS);
    let results = against_bf16(path, &prompt, every);
    for (dtype, b) in bounds {
        let Some((_, a)) = results.iter().find(|(d, _)| d == dtype) else {
            panic!("{label}: no result for {dtype}");
        };
        assert!(
            a.top1() >= b.min_top1,
            "{label} {dtype}: top-1 agreement {:.4} below {}",
            a.top1(),
            b.min_top1
        );
        assert!(
            a.worst_top5 <= b.max_worst_top5,
            "{label} {dtype}: worst top-5 error {:.4} above {}",
            a.worst_top5,
            b.max_worst_top5
        );
        assert!(
            a.mean_top5() <= b.max_mean_top5,
            "{label} {dtype}: mean top-5 error {:.4} above {}",
            a.mean_top5(),
            b.max_mean_top5
        );
    }
    // `auto` on CPU ranks keeps the type they compute in: no 8-bit type keeps greedy text
    // on most prompts (`greedy` tests below).
    assert_eq!(CPU_AUTO_KV, KvCacheDtype::F32);
}

/// Measured: int8 93.9% top-1, worst 1.20 nats, mean 0.200; fp8 90.4%, 2.13, 0.329. The
/// floor any perturbation of this quantized model reaches (measured once, not run here):
/// an f32 or an fp16 cache against bf16 agree at 95.8% and 94.9% of positions, worst 0.93
/// and 0.78 nats, mean 0.157 (its matmuls quantize activations to 8 bits, so the
/// smallest change to a key moves some rounding and, over 2048 positions and 30 layers,
/// the logits).
#[test]
fn smollm2_8_bit_kv_follows_bf16_kv_over_2048_tokens() {
    check_long_prompt(
        "SmolLM2",
        &smollm2_path(),
        1,
        &[
            (
                KvCacheDtype::Fp8E4m3,
                Bounds {
                    min_top1: 0.88,
                    max_worst_top5: 2.6,
                    max_mean_top5: 0.40,
                },
            ),
            (
                KvCacheDtype::Int8,
                Bounds {
                    min_top1: 0.92,
                    max_worst_top5: 1.6,
                    max_mean_top5: 0.25,
                },
            ),
        ],
    );
}

/// Every fourth position: Gemma's vocabulary of 262144 makes the logits of every position
/// the bulk of the test's time. Measured: fp8 91.0% top-1, worst 1.35 nats, mean 0.321;
/// int8 87.9%, 3.34, 0.396. Here fp8 is the closer of the two (a block's largest key
/// sets int8's step for all 256 dimensions of a Gemma head; fp8 keeps each value's
/// relative precision).
#[test]
fn gemma3_270m_8_bit_kv_follows_bf16_kv_over_2048_tokens() {
    check_long_prompt(
        "Gemma 3 270M",
        &gemma3_path(),
        4,
        &[
            (
                KvCacheDtype::Fp8E4m3,
                Bounds {
                    min_top1: 0.88,
                    max_worst_top5: 2.0,
                    max_mean_top5: 0.40,
                },
            ),
            (
                KvCacheDtype::Int8,
                Bounds {
                    min_top1: 0.85,
                    max_worst_top5: 4.0,
                    max_mean_top5: 0.48,
                },
            ),
        ],
    );
}

/// Where a greedy run first parts from bf16's: the token, and bf16's top-2 gap there.
type FirstDifference = Option<(usize, f32)>;

/// Greedy tokens from `prompts` with each 8-bit cache against bf16's: per prompt, the
/// first position where they differ (`None`: all equal) and bf16's gap between its two
/// most likely tokens there (in logits, which is the log-probability gap).
fn greedy_divergence(
    path: &Path,
    prompts: &[Vec<u32>],
    tokens: usize,
) -> Vec<(KvCacheDtype, Vec<FirstDifference>)> {
    let mut reference = engine(path, KvCacheDtype::Bf16);
    let want: Vec<(Vec<u32>, Vec<f32>)> = prompts
        .iter()
        .map(|p| greedy_steps(&mut reference, p, tokens, 256))
        .collect();
    drop(reference);
    EIGHT_BIT
        .iter()
        .map(|&d| {
            let mut e = engine(path, d);
            let firsts: Vec<FirstDifference> = prompts
                .iter()
                .zip(&want)
                .map(|(p, (w, gaps))| {
                    let got = greedy_steps(&mut e, p, tokens, 256).0;
                    let at = got.iter().zip(w).position(|(a, b)| a != b)?;
                    Some((at, gaps[at]))
                })
                .collect();
            let equal = firsts.iter().filter(|f| f.is_none()).count();
            println!(
                "{}: {d}: greedy text of {tokens} tokens equal to bf16's on {equal} of {} \
                 prompts; first differences (token, bf16's top-2 gap): {firsts:?}",
                path.display(),
                prompts.len()
            );
            (d, firsts)
        })
        .collect()
}

/// Greedy text equal to bf16's until bf16 itself nearly ties: an 8-bit cache may swap two
/// tokens whose logits bf16 puts within `max_gap`, never a clear choice. Measured on
/// SmolLM2: fp8 equal on 2 of 7 prompts, int8 on 0 of 7, every first difference at a
/// top-2 gap of 0.33 or less; Gemma 3 270M: each 1 of 7, gaps of 0.21 or less. Over 32 tokens
/// whole texts rarely stay equal on this quantized model whatever the cache (a position
/// where f32 and bf16 KV disagree comes about every 24 tokens, see the SmolLM2 test), so
/// the test bounds where they part, and prints how many stay equal.
fn check_greedy(label: &str, path: &Path, prompts: &[Vec<u32>], max_gap: f32) {
    for (dtype, firsts) in greedy_divergence(path, prompts, 32) {
        for (i, first) in firsts.iter().enumerate() {
            if let Some((at, gap)) = first {
                assert!(
                    *gap <= max_gap,
                    "{label} {dtype}: prompt {i} differs at token {at}, where bf16's top-2 \
                     gap is {gap}"
                );
            }
        }
    }
}

#[test]
fn smollm2_greedy_text_with_8_bit_kv_parts_from_bf16_kv_only_at_near_ties() {
    // The logits fixture's prompts, and the long prompt's first 512 tokens.
    let path = smollm2_path();
    let fixture = read_json(fixtures().join("smollm2/logits.json"));
    let mut prompts: Vec<Vec<u32>> = fixture["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| ids(&p["prompt_ids"]))
        .collect();
    prompts.push(long_prompt(&path, 512));
    check_greedy("SmolLM2", &path, &prompts, 0.5);
}

#[test]
fn gemma3_270m_greedy_text_with_8_bit_kv_parts_from_bf16_kv_only_at_near_ties() {
    let path = gemma3_path();
    let fixture = read_json(fixtures().join("gemma3_270m/transformers.json"));
    let mut prompts: Vec<Vec<u32>> = fixture["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| ids(&c["ids"]))
        .collect();
    prompts.push(long_prompt(&path, 512));
    check_greedy("Gemma 3 270M", &path, &prompts, 0.5);
}

/// The random-weight fixtures of families with each attention feature (windows, capped
/// scores, sinks, query/key norms, partial rotary, a mixture), over a random prompt of
/// 400 tokens.
#[test]
fn random_weight_families_with_8_bit_kv_follow_bf16_kv() {
    let mut worst = (String::new(), 0f64);
    let mut over = Vec::new();
    for model in [
        "tiny-llama3",
        "tiny-qwen3",
        "tiny-mistral",
        "tiny-gemma2",
        "tiny-gemma3",
        "tiny-gpt-oss",
        "tiny-olmo3",
        "tiny-phi3",
        "tiny-qwen3-moe",
    ] {
        let path = fixtures().join(model);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let prompt: Vec<u32> = (0..400)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % 512) as u32
            })
            .collect();
        let results = against_bf16(&path, &prompt, 1);
        for (dtype, a) in &results {
            let bound = match dtype {
                KvCacheDtype::Int8 => 0.45,
                _ => 1.4,
            };
            if a.mean_top5() > bound {
                over.push(format!("{model} {dtype}: {a}"));
            }
            if a.worst_top5 > worst.1 {
                worst = (format!("{model} {dtype}"), a.worst_top5);
            }
        }
    }
    println!("worst of the families: {} at {:.4} nats", worst.0, worst.1);
    // Random weights give flat distributions whose top tokens are near ties, so the
    // log-probabilities are the measure here, not the top-1 token; and their attention
    // is sharper than a trained model's, so a key's relative error moves scores more.
    // Measured means: int8 at most 0.353 nats (tiny-gemma3), fp8 at most 1.151
    // (tiny-gemma3; the others 0.23 or less). A dropped or wrong scale gives several.
    assert!(over.is_empty(), "{over:#?}");
}

/// The same budget holds about twice the blocks with one-byte entries as with bf16's two,
/// and half with f32's four (the scheduler's and `tessera_kv_blocks_total`'s count).
#[test]
fn the_same_budget_holds_twice_the_blocks_with_8_bit_entries() {
    let path = smollm2_path();
    let blocks = |d: KvCacheDtype| {
        let mut cfg = EngineConfig::new(&path);
        cfg.kv_cache_dtype = Some(KvCacheDtypeChoice::Fixed(d));
        cfg.kv_cache_bytes = 64 << 20;
        Engine::load(&cfg)
            .expect("load")
            .kv_cache_shape()
            .num_blocks
    };
    let bf16 = blocks(KvCacheDtype::Bf16);
    for (d, at_least, at_most) in [
        (KvCacheDtype::Fp8E4m3, 1.9, 2.0),
        (KvCacheDtype::Int8, 1.9, 2.0),
        (KvCacheDtype::F32, 0.5, 0.5),
        (KvCacheDtype::F16, 1.0, 1.0),
    ] {
        let ratio = blocks(d) as f64 / bf16 as f64;
        println!("{d}: {ratio:.3}× the blocks of bf16 ({bf16})");
        assert!(
            ratio >= at_least - 0.005 && ratio <= at_most + 0.005,
            "{d}: {ratio} × bf16's blocks"
        );
    }
}
