//! Causal attention that reads K/V through block tables (CPU).
//!
//! Keys and values of a sequence are never gathered into a contiguous copy: for each
//! query token and head the kernel walks the sequence's block table. New tokens' K/V are
//! written to their slots before attention runs (`kv_write`), so prefill chunks, decodes
//! and mixes of both take the same path.
//!
//! Keys are stored transposed within a block (see [`KvCache`]): the scores of a block's
//! positions are then a sum over head dimensions of a broadcast query value times a
//! contiguous row of keys, with no horizontal sums. A cache of another type than `f32` is
//! decoded a block of keys (and a task's values) at a time into `f32` scratch, with its
//! scales applied, and attended as an `f32` cache is.

use rayon::prelude::*;
use tessera_kernels::kv_quant::{decode_into, E4m3, KvElement};

use crate::model::fast_math::exp_nonpositive;
use crate::model::simd::simd_dispatch;

use crate::model::batch::Batch;
use crate::model::kv_cache::{with_layer, KvCache, LayerCache, TypedLayer};

/// Geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape<'a> {
    pub num_q_heads: usize,
    pub head_dim: usize,
    /// The local query heads of each local KV head ([`query_groups`]).
    pub groups: &'a [QueryGroup],
    pub scale: f32,
    /// Sliding-window layers: a token attends to its last `window` positions only.
    pub window: Option<usize>,
    /// Scaled scores become `cap · tanh(score / cap)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
    /// Per local query head, a logit that joins the softmax and attends to nothing
    /// (gpt-oss's sinks): it takes its share of the weight, and the values get the rest.
    pub sinks: Option<&'a [f32]>,
}

/// The local query heads that read one local KV head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryGroup {
    pub kv_head: usize,
    pub heads: Vec<usize>,
}

/// The query heads of each KV head, from each query head's KV head (`kv_of_q`); KV heads
/// no query head reads are left out. Fixed for a shard, so built once at load.
pub fn query_groups(kv_of_q: &[usize]) -> Vec<QueryGroup> {
    let mut groups: Vec<QueryGroup> = Vec::new();
    for (h, &kv) in kv_of_q.iter().enumerate() {
        match groups.iter_mut().find(|g| g.kv_head == kv) {
            Some(g) => g.heads.push(h),
            None => groups.push(QueryGroup {
                kv_head: kv,
                heads: vec![h],
            }),
        }
    }
    groups.sort_by_key(|g| g.kv_head);
    groups
}

/// `q`: `[tokens, num_q_heads * head_dim]` (rotated); returns the same shape.
///
/// Every (token, KV head, run of [`CHUNK_BLOCKS`] blocks of context) is an independent
/// task that serves all the query heads reading that KV head, so each key and value is
/// loaded once per group; a single decoding token still spreads its KV heads and its
/// context over the rank's threads.
pub fn attend(
    layer: &LayerCache,
    cache: &KvCache,
    batch: &Batch,
    q: &[f32],
    shape: AttentionShape<'_>,
) -> Vec<f32> {
    with_layer!(layer, l => attend_typed(l, cache, batch, q, shape))
}

fn attend_typed<T: CacheElement>(
    layer: &TypedLayer<T>,
    cache: &KvCache,
    batch: &Batch,
    q: &[f32],
    shape: AttentionShape<'_>,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let nq = shape.num_q_heads;
    let n = batch.num_tokens();
    // Token -> sequence lookup, so each output row is an independent task.
    let mut seq_of_token = Vec::with_capacity(n);
    for (s, seq) in batch.seqs.iter().enumerate() {
        seq_of_token.extend(std::iter::repeat_n(s, seq.num_tokens));
    }
    let groups = shape.groups;
    // Tasks: each token's context, per group, in runs of CHUNK_BLOCKS blocks.
    let chunk = CHUNK_BLOCKS * cache.block_size;
    let mut tasks: Vec<(usize, usize, std::ops::Range<usize>)> = Vec::new();
    for t in 0..n {
        let context = batch.positions[t] + 1;
        // A sliding window starts the runs at the block holding its first position; the
        // positions before it in that block are masked (`Group::first_visible`).
        let first = window_start(context, shape.window) / cache.block_size * cache.block_size;
        for g in 0..groups.len() {
            for start in (first..context).step_by(chunk) {
                tasks.push((t, g, start..(start + chunk).min(context)));
            }
        }
    }
    // One partial result per task, written in place (see `attend_group` for the layout).
    let max_heads = groups.iter().map(|g| g.heads.len()).max().unwrap_or(0);
    let stride = max_heads * (2 + hd);
    let mut partials = vec![0f32; tasks.len() * stride];
    partials
        .par_chunks_mut(stride.max(1))
        .zip(tasks.par_iter())
        .for_each(|(part, (t, g, positions))| {
            let QueryGroup { kv_head, heads } = &groups[*g];
            let group = Group {
                layer,
                cache,
                block_table: &batch.seqs[seq_of_token[*t]].block_table,
                kv_head: *kv_head,
                q: &q[t * nq * hd..(t + 1) * nq * hd],
                heads,
                positions: positions.clone(),
                first_visible: window_start(batch.positions[*t] + 1, shape.window),
                scale: shape.scale,
                softcap: shape.softcap,
            };
            // The scratch buffers leave the thread-local for the call: a closure run by
            // `LocalKey::with` would be compiled outside the vector build below.
            let mut scratch = SCRATCH.with_borrow_mut(std::mem::take);
            T::attend_group_simd(&group, &mut scratch, &mut part[..heads.len() * (2 + hd)]);
            SCRATCH.with_borrow_mut(|s| *s = scratch);
        });
    let mut out = vec![0f32; n * nq * hd];
    let mut first = 0;
    while first < tasks.len() {
        let (t, g, _) = tasks[first];
        let end = first
            + tasks[first..]
                .iter()
                .take_while(|(t2, g2, _)| (*t2, *g2) == (t, g))
                .count();
        let heads = &groups[g].heads;
        for (i, h) in heads.iter().enumerate() {
            merge_partials(
                partials[first * stride..end * stride].chunks_exact(stride),
                (heads.len(), hd, i),
                shape.sinks.and_then(|s| s.get(*h).copied()),
                &mut out[(t * nq + h) * hd..(t * nq + h + 1) * hd],
            );
        }
        first = end;
    }
    out
}

/// First position a token with `context` positions sees: 0, or the start of its window.
fn window_start(context: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| context.saturating_sub(w))
}

/// Blocks of context one attention task covers. A decoding token's context is split into
/// runs of this many blocks, so its few KV-head groups still make enough tasks for every
/// thread (3 groups on 2 threads left one idle a third of the time); the runs' partial
/// softmaxes are merged after. Fixed, not derived from the batch or the thread count, so
/// a token's result depends on neither; a context of one run is computed as before.
const CHUNK_BLOCKS: usize = 4;

/// Head `i`'s output from the partial results of one token and group over consecutive
/// runs of its context (see [`attend_group`] for their layout; `nh` heads of `hd`): each
/// run's weighted values are rescaled from its own maximum score to the largest, then
/// divided by the total weight, a `sink` logit's included.
fn merge_partials<'a>(
    parts: impl Iterator<Item = &'a [f32]> + Clone,
    (nh, hd, i): (usize, usize, usize),
    sink: Option<f32>,
    out: &mut [f32],
) {
    let runs_max = parts.clone().fold(f32::NEG_INFINITY, |m, p| m.max(p[i]));
    let max = sink.map_or(runs_max, |s| runs_max.max(s));
    let mut total = sink.map_or(0.0, |s| exp_nonpositive(s - max));
    out.fill(0.0);
    for p in parts {
        let w = exp_nonpositive(p[i] - max);
        total += w * p[nh + i];
        let acc = &p[2 * nh + i * hd..2 * nh + (i + 1) * hd];
        for (o, a) in out.iter_mut().zip(acc) {
            *o += w * a;
        }
    }
    let inv = 1.0 / total;
    out.iter_mut().for_each(|x| *x *= inv);
}

/// The query heads of one token that read the same KV head, over a sequence's blocks.
struct Group<'a, T> {
    layer: &'a TypedLayer<T>,
    cache: &'a KvCache,
    block_table: &'a [u32],
    kv_head: usize,
    /// The token's queries, `num_q_heads * head_dim`, and the heads of the group.
    q: &'a [f32],
    heads: &'a [usize],
    /// Positions attended by this task: a run of whole blocks (the last may be partial)
    /// of the token's context, its own position and earlier ones.
    positions: std::ops::Range<usize>,
    /// Positions before this one are outside the token's sliding window: weight 0.
    first_visible: usize,
    scale: f32,
    softcap: Option<f32>,
}

/// A cache element type with [`attend_group`] compiled for this CPU's vector unit.
trait CacheElement: KvElement {
    fn attend_group_simd(group: &Group<'_, Self>, scratch: &mut Scratch, out: &mut [f32]);
}

macro_rules! cache_elements {
    ($($t:ty => $name:ident),* $(,)?) => {$(
        simd_dispatch! {
            /// [`attend_group`] of one cache type, compiled for this CPU's vector unit.
            fn $name(group: &Group<'_, $t>, scratch: &mut Scratch, out: &mut [f32]) {
                attend_group(group, scratch, out)
            }
        }
        impl CacheElement for $t {
            fn attend_group_simd(group: &Group<'_, Self>, scratch: &mut Scratch, out: &mut [f32]) {
                $name(group, scratch, out)
            }
        }
    )*};
}

cache_elements! {
    f32 => attend_group_f32,
    half::bf16 => attend_group_bf16,
    half::f16 => attend_group_f16,
    E4m3 => attend_group_fp8,
    i8 => attend_group_int8,
}

/// Buffers a task reuses from task to task on its thread: scores, and a cache of another
/// type than `f32` decoded (a block of keys, the task's values).
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    keys: Vec<f32>,
    values: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = const {
        std::cell::RefCell::new(Scratch {
            scores: Vec::new(),
            keys: Vec::new(),
            values: Vec::new(),
        })
    };
}

/// Attention of each query head of the group over `group.positions`, as a partial
/// result to merge ([`merge_partials`]) written to `out` (`heads × (2 + head_dim)`): per
/// head its largest scaled score `m`, then per head `s = Σ e^(score − m)`, then per head
/// the `head_dim` sums `Σ e^(score − m)·v`.
#[inline(always)]
fn attend_group<T: KvElement>(group: &Group<'_, T>, scratch: &mut Scratch, out: &mut [f32]) {
    let cache = group.cache;
    let hd = cache.head_dim;
    let bs = cache.block_size;
    let nkv = cache.num_kv_heads;
    let stride = cache.slot_stride();
    let nh = group.heads.len();
    let query = |i: usize| &group.q[group.heads[i] * hd..(group.heads[i] + 1) * hd];
    let (lo, len) = (group.positions.start, group.positions.len());
    let Scratch {
        scores,
        keys: key_buf,
        values: value_buf,
    } = scratch;
    scores.clear();
    scores.resize(nh * len, 0.0);
    key_buf.resize(hd * bs, 0.0);
    let blocks = group.block_table.iter().enumerate();
    for (b, &block) in blocks.skip(lo / bs).take(len.div_ceil(bs)) {
        let first = b * bs - lo;
        let n = bs.min(len - first);
        let block = block as usize;
        let raw = &group.layer.k[cache.key_row(block, group.kv_head)..][..hd * bs];
        let keys: &[f32] = match T::as_f32(raw) {
            Some(keys) => keys,
            None => {
                let scale = group.layer.k_scale(block, group.kv_head, nkv);
                decode_into(raw, scale, key_buf);
                key_buf
            }
        };
        let row = |h: usize| h * len + first..h * len + first + n;
        if bs == KEY_LANES {
            // Up to four heads at once: one load of each key row serves them all, and
            // their sums are independent chains.
            for (h, take) in head_runs(nh) {
                let mut acc = [[0f32; KEY_LANES]; 4];
                match take {
                    4 => block_scores::<KEY_LANES, 4>(
                        std::array::from_fn(|i| query(h + i)),
                        keys,
                        &mut acc,
                    ),
                    3 => block_scores::<KEY_LANES, 3>(
                        std::array::from_fn(|i| query(h + i)),
                        keys,
                        &mut acc,
                    ),
                    2 => block_scores::<KEY_LANES, 2>(
                        std::array::from_fn(|i| query(h + i)),
                        keys,
                        &mut acc,
                    ),
                    _ => block_scores::<KEY_LANES, 1>([query(h)], keys, &mut acc),
                }
                for (i, a) in acc.iter().enumerate().take(take) {
                    scores[row(h + i)].copy_from_slice(&a[..n]);
                }
            }
        } else {
            for h in 0..nh {
                block_scores_any(query(h), keys, bs, &mut scores[row(h)]);
            }
        }
    }
    let hidden = group.first_visible.saturating_sub(lo).min(len);
    for (h, row) in scores.chunks_exact_mut(len).enumerate() {
        let (masked, row) = row.split_at_mut(hidden);
        masked.fill(0.0);
        // A capped score is scaled before the cap, so the softmax takes it as it is.
        let scale = match group.softcap {
            Some(cap) => {
                row.iter_mut()
                    .for_each(|s| *s = cap * (*s * group.scale / cap).tanh());
                1.0
            }
            None => group.scale,
        };
        let max = row.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s * scale));
        row.iter_mut()
            .for_each(|s| *s = exp_nonpositive(*s * scale - max));
        out[h] = max;
        out[nh + h] = sum(row);
    }
    let sums = &mut out[2 * nh..2 * nh + nh * hd];
    let slot = |i: usize| {
        let pos = lo + i;
        group.block_table[pos / bs] as usize * bs + pos % bs
    };
    match T::as_f32(&group.layer.v) {
        Some(v) => {
            let value = |i: usize| {
                let o = slot(i) * stride + group.kv_head * hd;
                &v[o..o + hd]
            };
            weighted_sums(scores, (len, nh, hd), &value, sums);
        }
        None => {
            // The task's values decoded once, whatever the number of heads reading them.
            value_buf.resize(len * hd, 0.0);
            for (i, dst) in value_buf.chunks_exact_mut(hd).enumerate() {
                let s = slot(i);
                let o = s * stride + group.kv_head * hd;
                let scale = group.layer.v_scale(s / bs, group.kv_head, nkv);
                decode_into(&group.layer.v[o..o + hd], scale, dst);
            }
            let value = |i: usize| &value_buf[i * hd..(i + 1) * hd];
            weighted_sums(scores, (len, nh, hd), &value, sums);
        }
    }
}

/// `sums[h] = Σ_i p_h[i]·value(i)` for the `nh` heads' weights `scores` (`len` each).
#[inline(always)]
fn weighted_sums<'a>(
    scores: &[f32],
    (len, nh, hd): (usize, usize, usize),
    value: &impl Fn(usize) -> &'a [f32],
    sums: &mut [f32],
) {
    if hd.is_multiple_of(VALUE_SLICE) {
        // Up to four heads at once, a slice of the head dimension at a time: one load of
        // each value slice serves all of them, and their sums stay in registers.
        for (h, take) in head_runs(nh) {
            let probs = |i: usize| &scores[(h + i) * len..(h + i + 1) * len];
            let heads = &mut sums[h * hd..(h + take) * hd];
            match take {
                4 => weighted_values::<4>(std::array::from_fn(probs), value, hd, heads),
                3 => weighted_values::<3>(std::array::from_fn(probs), value, hd, heads),
                2 => weighted_values::<2>(std::array::from_fn(probs), value, hd, heads),
                _ => weighted_values::<1>([probs(0)], value, hd, heads),
            }
        }
    } else {
        for (h, acc) in sums.chunks_exact_mut(hd).enumerate() {
            acc.fill(0.0);
            for (i, p) in scores[h * len..(h + 1) * len].iter().enumerate() {
                for (a, x) in acc.iter_mut().zip(value(i)) {
                    *a += p * x;
                }
            }
        }
    }
}

/// The runs of up to four of `nh` heads the register-resident loops take at once, as
/// (first head, heads).
fn head_runs(nh: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..nh).step_by(4).map(move |h| (h, (nh - h).min(4)))
}

/// Block size the register-resident score loop is built for (the cache's default); other
/// sizes take the general loop.
const KEY_LANES: usize = 16;
/// Head-dimension slice of the register-resident value loop (heads whose size is a
/// multiple of it); other head sizes take the general loop.
const VALUE_SLICE: usize = 64;

/// `out[h][i] = Σ_d q_h[d]·keys[d][i]` for one block of `L` transposed keys and `H` query
/// heads (`out` has room for at least `H`), the sums kept in registers. Each head's sum
/// runs over `d` in order, whatever `H`.
#[inline(always)]
fn block_scores<const L: usize, const H: usize>(
    qs: [&[f32]; H],
    keys: &[f32],
    out: &mut [[f32; L]; 4],
) {
    let mut acc = [[0f32; L]; H];
    for (d, row) in keys.chunks_exact(L).enumerate() {
        for (a, q) in acc.iter_mut().zip(&qs) {
            let qd = q[d];
            for (x, k) in a.iter_mut().zip(row) {
                *x += qd * k;
            }
        }
    }
    out[..H].copy_from_slice(&acc);
}

/// [`block_scores`] for any block size `bs`.
#[inline(always)]
fn block_scores_any(q: &[f32], keys: &[f32], bs: usize, out: &mut [f32]) {
    for (qd, row) in q.iter().zip(keys.chunks_exact(bs)) {
        for (s, k) in out.iter_mut().zip(row) {
            *s += qd * k;
        }
    }
}

/// `out[h] = Σ_pos p_h[pos]·v(pos)` for `H` heads (`out` holds their `hd` values each,
/// `hd` a multiple of [`VALUE_SLICE`]), one slice of [`VALUE_SLICE`] values at a time with
/// the `H` slices' sums in registers. Each value's sum runs over the positions in order,
/// whatever `H`.
#[inline(always)]
fn weighted_values<'a, const H: usize>(
    probs: [&[f32]; H],
    value: &impl Fn(usize) -> &'a [f32],
    hd: usize,
    out: &mut [f32],
) {
    for start in (0..hd).step_by(VALUE_SLICE) {
        let mut sum = [[0f32; VALUE_SLICE]; H];
        for pos in 0..probs[0].len() {
            let v = &value(pos)[start..start + VALUE_SLICE];
            for (s, p) in sum.iter_mut().zip(&probs) {
                let p = p[pos];
                for (a, x) in s.iter_mut().zip(v) {
                    *a += p * x;
                }
            }
        }
        for (h, s) in sum.iter().enumerate() {
            out[h * hd + start..h * hd + start + VALUE_SLICE].copy_from_slice(s);
        }
    }
}

const LANES: usize = 16;

/// Sum in 16 independent lanes.
#[inline(always)]
fn sum(xs: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..LANES {
            lanes[l] += c[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests;
