//! How a mixture's router turns each token's logits into its experts and their weights:
//! the softmax of Qwen3-MoE, Mixtral and gpt-oss, or GLM-4.5's sigmoid scores chosen with
//! per-expert correction biases among the best groups of experts.

use crate::spec::moe::{MoeConfig, SigmoidRouter};

/// One layer's routing rule.
#[derive(Debug, Clone)]
pub(crate) struct Routing {
    pub top_k: usize,
    /// The chosen experts' weights are divided by their sum.
    pub norm: bool,
    /// GLM-4.5's router and its `e_score_correction_bias` (one per expert).
    pub sigmoid: Option<(SigmoidRouter, Vec<f32>)>,
}

impl Routing {
    /// The rule of `moe`; `sigmoid` is its sigmoid router with the layer's correction
    /// biases, where it has one.
    pub fn new(moe: &MoeConfig, sigmoid: Option<(SigmoidRouter, Vec<f32>)>) -> Self {
        Self {
            top_k: moe.top_k,
            norm: moe.norm_topk_prob,
            sigmoid,
        }
    }

    /// Per token of `logits` (`[tokens, experts]`, row major): the chosen experts and
    /// their weights, best first.
    pub fn route(&self, logits: &[f32], experts: usize) -> Vec<Vec<(usize, f32)>> {
        match &self.sigmoid {
            None => route(logits, experts, self.top_k, self.norm),
            Some((router, bias)) => logits
                .chunks_exact(experts.max(1))
                .map(|row| sigmoid_route(row, bias, router, self.top_k, self.norm))
                .collect(),
        }
    }
}

/// Per token, the chosen experts and their weights: softmax over the router's logits,
/// the `k` most probable (ties to the lower index), renormalised to sum 1 if `norm`.
pub fn route(logits: &[f32], experts: usize, k: usize, norm: bool) -> Vec<Vec<(usize, f32)>> {
    logits
        .chunks_exact(experts.max(1))
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exp: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            let chosen = best(&exp, (0..row.len()).collect(), k);
            let mut chosen: Vec<(usize, f32)> =
                chosen.into_iter().map(|e| (e, exp[e] / sum)).collect();
            if norm {
                let total: f32 = chosen.iter().map(|(_, p)| p).sum();
                chosen.iter_mut().for_each(|(_, p)| *p /= total);
            }
            chosen
        })
        .collect()
}

/// The `k` of `candidates` with the highest `value`, highest first (ties to the lower
/// index).
fn best(value: &[f32], mut candidates: Vec<usize>, k: usize) -> Vec<usize> {
    candidates.sort_by(|a, b| value[*b].total_cmp(&value[*a]).then(a.cmp(b)));
    candidates.truncate(k);
    candidates
}

/// GLM-4.5's choice for one token (transformers' `Glm4MoeTopkRouter`): sigmoid scores;
/// each group's worth is the sum of its two best biased scores; among the experts of
/// the best groups, the `k` best biased scores; their unbiased scores as weights,
/// renormalised if `norm`, times the router's scale.
fn sigmoid_route(
    row: &[f32],
    bias: &[f32],
    router: &SigmoidRouter,
    k: usize,
    norm: bool,
) -> Vec<(usize, f32)> {
    let scores: Vec<f32> = row.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
    let biased: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let per = row.len() / router.groups.max(1);
    let worth: Vec<f32> = (0..router.groups)
        .map(|g| {
            let group: Vec<usize> = (g * per..(g + 1) * per).collect();
            best(&biased, group, 2).iter().map(|e| biased[*e]).sum()
        })
        .collect();
    let groups = best(&worth, (0..router.groups).collect(), router.top_groups);
    let candidates = groups.iter().flat_map(|g| g * per..(g + 1) * per).collect();
    let chosen = best(&biased, candidates, k);
    let total: f32 = chosen.iter().map(|e| scores[*e]).sum::<f32>() + 1e-20;
    chosen
        .into_iter()
        .map(|e| {
            let w = if norm { scores[e] / total } else { scores[e] };
            (e, w * router.scale)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_keeps_the_top_k_and_renormalises() {
        // Logits of 4 experts: softmax order 2, 0, 3, 1.
        let logits = [1.0f32, -1.0, 2.0, 0.5];
        let r = route(&logits, 4, 2, false);
        let e: Vec<f32> = logits.iter().map(|v| v.exp()).collect();
        let total: f32 = e.iter().sum();
        assert_eq!(r[0][0].0, 2);
        assert_eq!(r[0][1].0, 0);
        assert!((r[0][0].1 - e[2] / total).abs() < 1e-6);
        let r = route(&logits, 4, 2, true);
        assert!((r[0][0].1 - e[2] / (e[2] + e[0])).abs() < 1e-6);
        assert!((r[0][0].1 + r[0][1].1 - 1.0).abs() < 1e-6);
        // Equal logits: the lower index wins.
        let r = route(&[0.0, 0.0, 0.0], 3, 1, true);
        assert_eq!(r[0], vec![(0, 1.0)]);
    }

    fn sigmoid(x: f32) -> f32 {
        1.0 / (1.0 + (-x).exp())
    }

    #[test]
    fn sigmoid_routing_chooses_by_biased_scores_in_the_best_groups() {
        // Two groups of three; sigmoid scores .95 .12 .12 | .50 .73 .27. The biases lift
        // group 1's worth to 1.73 + 0.80 (group 0: 0.95 + 0.12), and within it expert 4
        // ahead of expert 3.
        let logits = [3.0f32, -2.0, -2.0, 0.0, 1.0, -1.0];
        let bias = [0.0f32, 0.0, 0.0, 0.3, 1.0, 0.0];
        let router = SigmoidRouter {
            groups: 2,
            top_groups: 1,
            scale: 2.5,
        };
        let r = sigmoid_route(&logits, &bias, &router, 2, true);
        let ids: Vec<usize> = r.iter().map(|(e, _)| *e).collect();
        assert_eq!(ids, vec![4, 3]);
        // Weights: the unbiased scores, renormalised, times the scale.
        let (s4, s3) = (sigmoid(1.0), sigmoid(0.0));
        assert!((r[0].1 - 2.5 * s4 / (s4 + s3)).abs() < 1e-6);
        assert!((r[1].1 - 2.5 * s3 / (s4 + s3)).abs() < 1e-6);
        // Without renormalising: the scores times the scale.
        let r = sigmoid_route(&logits, &bias, &router, 2, false);
        assert!((r[0].1 - 2.5 * s4).abs() < 1e-6);
        // Both groups open: expert 4 (1.73 biased) then expert 0 (0.95).
        let open = SigmoidRouter {
            top_groups: 2,
            ..router
        };
        let r = sigmoid_route(&logits, &bias, &open, 2, true);
        assert_eq!(r.iter().map(|(e, _)| *e).collect::<Vec<_>>(), vec![4, 0]);
        // Without biases and both groups open, expert 0 leads.
        let r = sigmoid_route(&logits, &[0.0; 6], &open, 2, true);
        assert_eq!(r.iter().map(|(e, _)| *e).collect::<Vec<_>>(), vec![0, 4]);
    }
}
