//! Step plans and their outcomes between the leader and a worker node: the leader's
//! [`Batch`] goes out as it is, and each node answers with the outcome of its ranks.
//! JSON in [`Kind::Step`](crate::tp::wire::Kind) / `StepResult` frames; every index in
//! a received batch is bounds-checked by the forward pass as for a local one.

use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::model::{Batch, BatchSeq};

/// Largest step frame: a batch of the largest token budget with its block tables.
pub(crate) const MAX_STEP_BYTES: usize = 64 << 20;

#[derive(Serialize, Deserialize)]
struct WireSeq {
    token_start: usize,
    num_tokens: usize,
    start_pos: usize,
    block_table: Vec<u32>,
}

#[derive(Serialize, Deserialize)]
struct WireBatch {
    token_ids: Vec<u32>,
    positions: Vec<usize>,
    slots: Vec<usize>,
    seqs: Vec<WireSeq>,
    sample_rows: Vec<usize>,
    row_reduce: Vec<crate::model::batch::RowReduce>,
    /// Hybrid KV groups 1..: their slots and tables (empty with one group).
    #[serde(default)]
    groups: Vec<crate::model::GroupAddress>,
}

pub(crate) fn encode_batch(b: &Batch) -> Vec<u8> {
    let wire = WireBatch {
        token_ids: b.token_ids.clone(),
        positions: b.positions.clone(),
        slots: b.slots.clone(),
        seqs: b
            .seqs
            .iter()
            .map(|s| WireSeq {
                token_start: s.token_start,
                num_tokens: s.num_tokens,
                start_pos: s.start_pos,
                block_table: s.block_table.clone(),
            })
            .collect(),
        sample_rows: b.sample_rows.clone(),
        row_reduce: b.row_reduce.clone(),
        groups: b.groups.clone(),
    };
    serde_json::to_vec(&wire).unwrap_or_default()
}

/// A batch from the leader. Its shape is checked here (lengths agree, sequences lie in
/// the token range); values are checked where they are used, as for a local batch.
pub(crate) fn decode_batch(bytes: &[u8]) -> Result<Batch, String> {
    let w: WireBatch =
        serde_json::from_slice(bytes).map_err(|e| format!("a step that is not one: {e}"))?;
    let n = w.token_ids.len();
    if w.positions.len() != n || w.slots.len() != n {
        return Err(format!(
            "a step of {n} tokens with {} positions and {} slots",
            w.positions.len(),
            w.slots.len()
        ));
    }
    if w.seqs.iter().any(|s| {
        s.token_start
            .checked_add(s.num_tokens)
            .is_none_or(|end| end > n)
    }) {
        return Err("a step whose sequences lie outside its tokens".into());
    }
    if w.sample_rows.iter().any(|r| *r >= n) {
        return Err("a step that samples a row it does not have".into());
    }
    if w.groups
        .iter()
        .any(|g| g.slots.len() != n || g.tables.len() != w.seqs.len())
    {
        return Err("a step whose KV groups do not address its tokens".into());
    }
    Ok(Batch {
        token_ids: w.token_ids,
        positions: w.positions,
        slots: w.slots,
        seqs: w
            .seqs
            .into_iter()
            .map(|s| BatchSeq {
                token_start: s.token_start,
                num_tokens: s.num_tokens,
                start_pos: s.start_pos,
                block_table: s.block_table,
            })
            .collect(),
        sample_rows: w.sample_rows,
        row_reduce: w.row_reduce,
        // Pooled on the leader's rank that returns logits only.
        pool: Vec::new(),
        groups: w.groups,
    })
}

/// A node's outcome of a step, keeping what the leader's engine needs to decide
/// whether the group survives it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum WireOutcome {
    Done,
    Rank {
        rank: usize,
        message: String,
    },
    Group {
        rank: Option<usize>,
        message: String,
    },
    Aborted {
        message: String,
    },
    Step {
        message: String,
    },
}

pub(crate) fn encode_outcome(r: &Result<(), EngineError>) -> Vec<u8> {
    let o = match r {
        Ok(()) => WireOutcome::Done,
        Err(EngineError::Rank { rank, message }) => WireOutcome::Rank {
            rank: *rank,
            message: message.clone(),
        },
        Err(EngineError::GroupFailed { rank, message }) => WireOutcome::Group {
            rank: *rank,
            message: message.clone(),
        },
        Err(EngineError::CommAborted(m)) => WireOutcome::Aborted { message: m.clone() },
        Err(e) if e.fails_group() => WireOutcome::Group {
            rank: None,
            message: e.to_string(),
        },
        Err(e) => WireOutcome::Step {
            message: e.to_string(),
        },
    };
    serde_json::to_vec(&o).unwrap_or_default()
}

pub(crate) fn decode_outcome(bytes: &[u8]) -> Result<(), EngineError> {
    let o: WireOutcome = serde_json::from_slice(bytes).map_err(|e| EngineError::GroupFailed {
        rank: None,
        message: format!("a worker node answered a step with garbage: {e}"),
    })?;
    match o {
        WireOutcome::Done => Ok(()),
        WireOutcome::Rank { rank, message } => Err(EngineError::Rank { rank, message }),
        WireOutcome::Group { rank, message } => Err(EngineError::GroupFailed { rank, message }),
        WireOutcome::Aborted { message } => Err(EngineError::CommAborted(message)),
        WireOutcome::Step { message } => Err(EngineError::Step(message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip_and_bad_shapes_are_refused() {
        let b = Batch {
            token_ids: vec![1, 2, 3],
            positions: vec![0, 1, 2],
            slots: vec![16, 17, 18],
            seqs: vec![BatchSeq {
                token_start: 0,
                num_tokens: 3,
                start_pos: 0,
                block_table: vec![1],
            }],
            sample_rows: vec![2],
            row_reduce: vec![crate::model::batch::RowReduce::Argmax],
            pool: Vec::new(),
            groups: Vec::new(),
        };
        assert_eq!(decode_batch(&encode_batch(&b)), Ok(b.clone()));
        let mut bad = b.clone();
        bad.seqs[0].num_tokens = 4;
        assert!(decode_batch(&encode_batch(&bad)).is_err());
        let mut bad = b;
        bad.slots.pop();
        assert!(decode_batch(&encode_batch(&bad)).is_err());
        assert!(decode_batch(b"{\"token_ids\": 5}").is_err());
    }

    #[test]
    fn outcomes_keep_their_kind() {
        let e = EngineError::Rank {
            rank: 3,
            message: "boom".into(),
        };
        let back = decode_outcome(&encode_outcome(&Err(e)));
        assert!(matches!(back, Err(EngineError::Rank { rank: 3, .. })));
        let back = decode_outcome(&encode_outcome(&Err(EngineError::Device("gone".into()))));
        assert!(back.is_err_and(|e| e.fails_group()));
        assert!(decode_outcome(&encode_outcome(&Ok(()))).is_ok());
    }
}
