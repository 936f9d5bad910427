//! Sampling a chunk's rows, with speculative guesses: a row after the sequence's last
//! token and one after each guess. Each row is sampled as the sequence's next token
//! would be (the same sampler, whose state advances only with tokens it emits), and a
//! guess is kept while it equals the token sampled before it.
//!
//! For a guess made without a distribution (n-gram lookup), drawing the target's token
//! and keeping the guess when they agree is exactly speculative sampling's rejection
//! rule: the guess survives with the target's probability for it, and a rejected
//! position emits the target's own draw, distributed as the target renormalized without
//! the guess. So the output is distributed as without speculation (greedy: equal token
//! for token; seeded: the same draws in the same order).

use tessera_protocol::TokenLogprobs;

use crate::sampler::Sampler;
use crate::worker::Reduced;

/// One row's logits as the rank handed them back.
pub(super) enum Row<'a> {
    Reduced(Reduced),
    Logits(&'a mut [f32]),
}

/// The tokens a chunk emits from its `rows` (one after the last token, one after each of
/// `drafts`): the first row's sample, then one more per guess kept. Stops early at a
/// grammar fault, which the caller reads from the sampler.
pub(super) fn sample_rows(
    sampler: &mut Sampler,
    rows: Vec<Row<'_>>,
    drafts: &[u32],
) -> Vec<(u32, Option<TokenLogprobs>)> {
    let mut emitted: Vec<(u32, Option<TokenLogprobs>)> = Vec::with_capacity(rows.len());
    for (i, row) in rows.into_iter().enumerate() {
        // Row i was computed after guess i - 1; it counts only if that guess was kept.
        let kept = i == 0
            || (emitted.len() == i
                && emitted.get(i - 1).map(|(t, _)| *t) == drafts.get(i - 1).copied());
        if !kept {
            break;
        }
        let out = match row {
            Row::Reduced(Reduced::Token(token)) => (sampler.accept(token), None),
            Row::Reduced(Reduced::Candidates(c)) => (sampler.sample_candidates(&c), None),
            Row::Reduced(Reduced::Scored {
                argmax,
                candidates,
                log_sum_exp,
            }) => sampler.sample_scored(argmax, &candidates, log_sum_exp),
            Row::Logits(logits) => sampler.sample(logits),
        };
        if sampler.grammar_fault().is_some() {
            break;
        }
        emitted.push(out);
    }
    emitted
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::SamplingParams;

    fn run(params: &SamplingParams, rows: &[Vec<f32>], drafts: &[u32]) -> Vec<u32> {
        let mut sampler = Sampler::new(params.clone(), &[1, 2]);
        let mut rows: Vec<Vec<f32>> = rows.to_vec();
        let rows = rows
            .iter_mut()
            .map(|r| Row::Logits(r.as_mut_slice()))
            .collect();
        sample_rows(&mut sampler, rows, drafts)
            .into_iter()
            .map(|(t, _)| t)
            .collect()
    }

    #[test]
    fn greedy_keeps_guesses_while_they_are_the_arg_max() {
        let greedy = SamplingParams::greedy();
        let rows = vec![
            vec![0.0, 5.0, 1.0],
            vec![3.0, 0.0, 1.0],
            vec![0.0, 0.0, 9.0],
        ];
        // Guesses 1 then 0 agree with the arg-max of rows 0 and 1: all three rows emit.
        assert_eq!(run(&greedy, &rows, &[1, 0]), vec![1, 0, 2]);
        // The second guess is wrong: row 1's own arg-max replaces it, row 2 is dropped.
        assert_eq!(run(&greedy, &rows, &[1, 2]), vec![1, 0]);
        // The first guess is wrong: only row 0 counts.
        assert_eq!(run(&greedy, &rows, &[2, 0]), vec![1]);
        assert_eq!(run(&greedy, &rows[..1], &[]), vec![1]);
    }

    /// With sampling, the first token is distributed as the target's first row, and a
    /// second token comes exactly when the first equals the guess, distributed as the
    /// second row: checked over many seeds against the softmax. Accepting every guess
    /// would emit the (unlikely) guess first every time and fail.
    #[test]
    fn sampled_tokens_keep_the_target_distribution() {
        let rows = vec![vec![0.0, 1.0, 2.0, -1.0], vec![2.0, 0.5, 0.0, 1.0]];
        let softmax = |r: &[f32]| -> Vec<f64> {
            let m = r.iter().fold(f32::MIN, |a, b| a.max(*b));
            let e: Vec<f64> = r.iter().map(|x| f64::from(x - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect()
        };
        let (p0, p1) = (softmax(&rows[0]), softmax(&rows[1]));
        let guess = 3u32; // the first row's least likely token
        let n = 40_000;
        let (mut first, mut second, mut seconds) = (vec![0usize; 4], vec![0usize; 4], 0usize);
        for seed in 0..n {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(seed as u64),
                ..SamplingParams::default()
            };
            let out = run(&params, &rows, &[guess]);
            first[out[0] as usize] += 1;
            assert_eq!(out.len() == 2, out[0] == guess, "{out:?}");
            if let Some(t) = out.get(1) {
                second[*t as usize] += 1;
                seconds += 1;
            }
        }
        for (t, p) in p0.iter().enumerate() {
            let got = first[t] as f64 / n as f64;
            let sd = (p * (1.0 - p) / n as f64).sqrt();
            assert!(
                (got - p).abs() < 5.0 * sd,
                "first token {t}: {got} against {p}"
            );
        }
        assert!(seconds > 1000, "{seconds} second tokens");
        for (t, p) in p1.iter().enumerate() {
            let got = second[t] as f64 / seconds as f64;
            let sd = (p * (1.0 - p) / seconds as f64).sqrt();
            assert!(
                (got - p).abs() < 5.0 * sd,
                "second token {t}: {got} against {p}"
            );
        }
    }
}
