//! Tests of the sampler (`sampler.rs`).

use tessera_protocol::{SamplingParams, TokenLogprobs};

use crate::model::batch::RowReduce;
use crate::sampler::*;

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::default();
    f(&mut p);
    p
}

#[test]
fn greedy_takes_the_first_maximum() {
    let mut s = Sampler::new(SamplingParams::greedy(), &[]);
    assert_eq!(s.sample(&mut [0.1, 2.0, 2.0, -1.0]).0, 1);
}

/// The scan the vectorized arg-max must agree with: move on strictly larger only.
fn argmax_by_scan(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, l) in logits.iter().enumerate() {
        if *l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn argmax_agrees_with_a_plain_scan_on_ties_nans_and_tails() {
    let mut cases: Vec<Vec<f32>> = vec![
        vec![],
        vec![f32::NAN, 1.0, 2.0],
        vec![f32::NEG_INFINITY; 40],
        vec![f32::NAN; 17],
        vec![1.0, f32::NAN, 1.0],
    ];
    for len in [1usize, 15, 16, 17, 33, 262_144 + 5] {
        let v: Vec<f32> = (0..len)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.01)
            .collect();
        cases.push(v.clone());
        // The maximum repeated at both ends and in the tail, and a NaN inside.
        let mut w = v.clone();
        w[len - 1] = 50.0;
        w[len / 2] = 50.0;
        cases.push(w.clone());
        w[len / 3] = f32::NAN;
        cases.push(w);
    }
    for c in &cases {
        assert_eq!(argmax(c), argmax_by_scan(c), "{:?}", &c[..c.len().min(8)]);
    }
}

#[test]
fn same_seed_same_tokens_different_seed_differs() {
    let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
    let run = |seed| {
        let mut s = Sampler::new(params(|p| p.seed = Some(seed)), &[]);
        (0..40)
            .map(|_| s.sample(&mut logits.clone()).0)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn top_k_one_and_min_p_restrict_the_choice() {
    let logits = vec![1.0, 3.0, 2.9, 0.0];
    let mut s = Sampler::new(
        params(|p| {
            p.top_k = 2;
            p.seed = Some(1)
        }),
        &[],
    );
    for _ in 0..50 {
        assert!([1, 2].contains(&s.sample(&mut logits.clone()).0));
    }
    let mut s = Sampler::new(
        params(|p| {
            p.min_p = 0.95;
            p.seed = Some(1)
        }),
        &[],
    );
    for _ in 0..50 {
        assert_eq!(s.sample(&mut logits.clone()).0, 1);
    }
    let mut s = Sampler::new(
        params(|p| {
            p.top_p = 0.01;
            p.seed = Some(3)
        }),
        &[],
    );
    for _ in 0..50 {
        assert_eq!(s.sample(&mut logits.clone()).0, 1);
    }
}

#[test]
fn bias_and_penalties_change_the_greedy_choice() {
    let mut s = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.logit_bias = vec![(0, 5.0)]
        }),
        &[],
    );
    assert_eq!(s.sample(&mut [1.0, 3.0]).0, 0);
    let mut s = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.frequency_penalty = 2.0
        }),
        &[],
    );
    assert_eq!(s.sample(&mut [1.0, 2.0]).0, 1);
    assert_eq!(
        s.sample(&mut [1.0, 2.0]).0,
        0,
        "token 1 penalised once by 2.0"
    );
    // Presence: a flat amount once a token has appeared, however often; not for the
    // prompt's tokens.
    let mut s = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.presence_penalty = 1.5
        }),
        &[1],
    );
    let mut logits = [1.0, 2.0, 0.0];
    assert_eq!(
        s.sample(&mut logits).0,
        1,
        "a prompt token is not penalised"
    );
    assert_eq!(logits, [1.0, 2.0, 0.0]);
    let mut logits = [1.0, 2.0, 0.0];
    assert_eq!(s.sample(&mut logits).0, 0, "token 1 penalised by 1.5");
    assert_eq!(logits, [1.0, 0.5, 0.0]);
    let mut logits = [1.0, 2.0, 0.0];
    s.sample(&mut logits);
    assert_eq!(
        logits,
        [-0.5, 0.5, 0.0],
        "each of tokens 0 and 1 penalised once, not per occurrence"
    );
    let mut s = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.presence_penalty = -1.5
        }),
        &[],
    );
    s.sample(&mut [1.0, 2.0]);
    assert_eq!(
        s.sample(&mut [2.9, 2.0]).0,
        1,
        "a negative presence penalty favours the token seen"
    );
    let mut s = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.repetition_penalty = 2.0
        }),
        &[1],
    );
    assert_eq!(
        s.sample(&mut [1.5, 2.0]).0,
        0,
        "prompt token 1 divided by 2"
    );
}

#[test]
fn logprobs_are_normalised_and_sorted() {
    let mut s = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.logprobs = Some(2)
        }),
        &[],
    );
    let (tok, lp) = s.sample(&mut [0.0, 1.0, 2.0]);
    let lp = lp.unwrap_or(TokenLogprobs {
        logprob: 0.0,
        top: vec![],
    });
    assert_eq!(tok, 2);
    let z: f32 = [0.0f32, 1.0, 2.0].iter().map(|x| x.exp()).sum();
    assert!((lp.logprob - (2.0 - z.ln())).abs() < 1e-5);
    assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
}

/// 3000 logits drawn from `[-spread, spread)` by a fixed generator, token 7 at -inf.
fn spread_row(seed: u64, spread: f32) -> Vec<f32> {
    let mut state = seed;
    let mut row: Vec<f32> = (0..3000)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            spread * ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
        })
        .collect();
    row[7] = f32::NEG_INFINITY;
    row
}

#[test]
fn candidates_draw_what_the_whole_row_draws() {
    // Peaked and flat rows with -inf and NaN entries, under plain temperature and
    // top-k / top-p / min-p: a sampler handed the row's candidates draws the same
    // token, seed for seed, as one handed the whole row.
    let mut fewer = false;
    for spread in [0.5f32, 4.0, 30.0] {
        let mut row = spread_row(0x9e37_79b9, spread);
        row[11] = f32::NAN;
        for (t, k, top_p, min_p) in [
            (1.0, 0, 1.0, 0.0),
            (0.7, 0, 0.9, 0.0),
            (1.3, 40, 1.0, 0.05),
            (0.05, 0, 1.0, 0.0),
        ] {
            let p = params(|p| {
                p.temperature = t;
                p.top_k = k;
                p.top_p = top_p;
                p.min_p = min_p;
                p.seed = Some(9);
            });
            let (mut whole, mut reduced) = (Sampler::new(p.clone(), &[]), Sampler::new(p, &[]));
            assert_eq!(
                reduced.reduction(),
                RowReduce::Candidates { temperature: t }
            );
            let cand = sampling_candidates(&row, t);
            assert!(cand.windows(2).all(|w| w[0].0 < w[1].0), "in token order");
            assert!(cand.iter().all(|(i, l)| row[*i as usize] == *l));
            fewer |= cand.len() < 2998;
            for draw in 0..40 {
                let want = whole.sample(&mut row.clone()).0;
                assert_eq!(
                    reduced.sample_candidates(&cand),
                    want,
                    "spread {spread} t {t} draw {draw}"
                );
            }
        }
    }
    assert!(fewer, "some rows leave tokens out");
}

/// A row reduced for log-probabilities (arg-max, candidates at `max(t, 1)`, a
/// log-sum-exp summed in another order) gives the token, seed for seed, and the
/// log-probabilities the whole row gives.
#[test]
fn scored_rows_give_what_whole_rows_give() {
    for spread in [0.5f32, 4.0, 30.0] {
        let row = spread_row(0x2545_f491, spread);
        for (t, top) in [(0.0, 5), (0.0, 0), (0.7, 3), (1.6, 20), (1.0, 1)] {
            let p = params(|p| {
                p.temperature = t;
                p.top_p = 0.9;
                p.logprobs = Some(top);
                p.seed = Some(5);
            });
            let (mut whole, mut reduced) = (Sampler::new(p.clone(), &[]), Sampler::new(p, &[]));
            let RowReduce::Scored { temperature, .. } = reduced.reduction() else {
                panic!("a raw row with log-probabilities is scored");
            };
            let cand = sampling_candidates(&row, temperature.max(1.0));
            assert!(
                cand.len() >= top,
                "spread {spread}: {} candidates",
                cand.len()
            );
            let lse = row.iter().map(|l| f64::from(*l).exp()).sum::<f64>().ln() as f32;
            for draw in 0..20 {
                let (want_token, want) = whole.sample(&mut row.clone());
                let (token, got) = reduced.sample_scored(argmax(&row), &cand, lse);
                let what = format!("spread {spread} t {t} top {top} draw {draw}");
                assert_eq!(token, want_token, "{what}");
                let (Some(got), Some(want)) = (got, want) else {
                    panic!("{what}: log-probabilities on both sides");
                };
                assert!((got.logprob - want.logprob).abs() < 1e-4, "{what}");
                assert_eq!(got.top.len(), want.top.len(), "{what}");
                for (g, w) in got.top.iter().zip(&want.top) {
                    assert_eq!(g.0, w.0, "{what}");
                    assert!((g.1 - w.1).abs() < 1e-4, "{what}: {g:?} {w:?}");
                }
            }
        }
    }
}

#[test]
fn only_raw_logit_draws_are_reduced() {
    let reduction = |f: fn(&mut SamplingParams)| Sampler::new(params(f), &[]).reduction();
    assert_eq!(reduction(|p| p.temperature = 0.0), RowReduce::Argmax);
    assert_eq!(
        reduction(|p| p.temperature = 0.5),
        RowReduce::Candidates { temperature: 0.5 }
    );
    for (temperature, top) in [(0.0, 3), (0.5, 0)] {
        let p = params(|p| {
            p.temperature = temperature;
            p.logprobs = Some(top);
        });
        assert_eq!(
            Sampler::new(p, &[]).reduction(),
            RowReduce::Scored { temperature, top }
        );
    }
    for f in [
        (|p: &mut SamplingParams| {
            p.logprobs = Some(2);
            p.logit_bias = vec![(3, 1.0)]
        }) as fn(&mut SamplingParams),
        |p| p.logit_bias = vec![(3, 1.0)],
        |p| p.repetition_penalty = 1.1,
        |p| p.presence_penalty = 0.5,
        |p| {
            p.temperature = 0.0;
            p.frequency_penalty = 0.5
        },
    ] {
        assert_eq!(reduction(f), RowReduce::Logits);
    }
}

#[test]
fn stop_tokens_cannot_be_sampled_before_min_tokens() {
    let eos = 3u32;
    let mut sampler = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.min_tokens = 2;
            p.min_tokens_blocked = vec![eos];
        }),
        &[],
    );
    let row = || vec![0.0f32, 1.0, 2.0, 9.0];
    for _ in 0..2 {
        assert_eq!(sampler.reduction(), RowReduce::Logits);
        assert_eq!(
            sampler.sample(&mut row()).0,
            2,
            "the stop token was sampled early"
        );
    }
    assert_eq!(sampler.reduction(), RowReduce::Argmax);
    assert_eq!(sampler.sample(&mut row()).0, eos);
}

#[test]
fn a_thinking_block_runs_free_and_the_grammar_starts_after_it() {
    use crate::structured::GrammarCompiler;
    use tessera_protocol::{OutputConstraint, ThinkingTags};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizer/smollm2-hf");
    let tokenizer = tessera_tokenizer::Tokenizer::from_hf_dir(&dir).expect("fixture tokenizer");
    let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).expect("compiler");
    let id = |text: &str| tokenizer.encode(text, false).expect("encode")[0];
    let (open, close, word, brace) = (id("<"), id(">"), id("hello"), id("{"));
    let gated = || {
        let p = params(|p| {
            p.temperature = 0.0;
            p.thinking = Some(ThinkingTags {
                open: Some(open),
                close: ">".into(),
                starts_open: false,
            });
        });
        let json = compiler.compile(&OutputConstraint::JsonObject);
        Sampler::new(p, &[]).with_constraint(json.expect("compiles"))
    };
    let mut sampler = gated();
    let row = |best: &[(u32, f32)]| {
        let mut logits = vec![0.0f32; tokenizer.vocab_size()];
        for &(t, l) in best {
            logits[t as usize] = l;
        }
        logits
    };
    // The first token may open the block, though the grammar would refuse it.
    assert_eq!(sampler.reduction(), RowReduce::Logits);
    assert_eq!(
        sampler.sample(&mut row(&[(open, 9.0), (brace, 1.0)])).0,
        open
    );
    // Inside it nothing is masked, so the device may reduce the row.
    assert_eq!(sampler.reduction(), RowReduce::Argmax);
    assert_eq!(
        sampler.sample(&mut row(&[(word, 9.0), (brace, 1.0)])).0,
        word
    );
    assert_eq!(sampler.sample(&mut row(&[(close, 9.0)])).0, close);
    // After the close tag the grammar masks again: no word before the JSON object.
    assert_eq!(sampler.reduction(), RowReduce::Logits);
    assert_eq!(
        sampler.sample(&mut row(&[(word, 9.0), (brace, 1.0)])).0,
        brace
    );
    assert_eq!(sampler.grammar_fault(), None);

    // A reply that does not open the block is under the grammar from its first token.
    let mut sampler = gated();
    assert_eq!(
        sampler.sample(&mut row(&[(word, 9.0), (brace, 1.0)])).0,
        brace
    );
    assert_ne!(sampler.sample(&mut row(&[(open, 9.0)])).0, open);
}

#[test]
fn allowed_tokens_and_bad_words_mask_the_row() {
    let row = || vec![5.0f32, 4.0, 3.0, 2.0, 1.0, 0.0];
    let mut only = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.allowed_token_ids = vec![4, 2];
        }),
        &[],
    );
    assert_eq!(only.reduction(), RowReduce::Logits);
    assert_eq!(only.sample(&mut row()).0, 2);
    // Token 1 may not follow token 0; token 3 may never be sampled.
    let mut bad = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.bad_words = vec![vec![0, 1], vec![3]];
        }),
        &[],
    );
    assert_eq!(bad.reduction(), RowReduce::Logits);
    assert_eq!(bad.sample(&mut row()).0, 0);
    assert_eq!(bad.sample(&mut [0.0, 9.0, 1.0, 8.0]).0, 2);
    assert_eq!(bad.sample(&mut [0.0, 9.0, 1.0, 8.0]).0, 1);
}

#[test]
fn a_spent_thinking_budget_forces_the_closing_tag() {
    let budget = tessera_protocol::ThinkingBudget {
        tokens: 2,
        open: vec![],
        close: vec![3, 4],
        starts_open: true,
    };
    let mut s = Sampler::new(
        params(|p| {
            p.temperature = 0.0;
            p.thinking_budget = Some(budget)
        }),
        &[],
    );
    // Token 0 is always the model's choice; the budget allows two of them.
    let row = || vec![5.0, 1.0, 0.5, -1.0, -2.0];
    assert_eq!(s.reduction(), RowReduce::Argmax);
    assert_eq!(s.sample(&mut row()).0, 0);
    assert_eq!(s.sample(&mut row()).0, 0);
    assert_eq!(
        s.reduction(),
        RowReduce::Logits,
        "the whole row while forcing"
    );
    assert_eq!(s.sample(&mut row()).0, 3);
    assert_eq!(s.sample(&mut row()).0, 4);
    assert_eq!(s.reduction(), RowReduce::Argmax);
    assert_eq!(s.sample(&mut row()).0, 0, "the answer is free again");
}
