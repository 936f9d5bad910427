//! A cap on a reply's thinking: the tokens generated inside its thinking block are
//! counted, and once the budget is spent the tokens of the closing tag are forced, one a
//! step, so the reply goes on to its answer. The block is found by token ids: it opens
//! where the generated tokens end with the opening tag's (or at once, when the prompt
//! opened it) and closes where they end with the closing tag's.

use tessera_protocol::ThinkingBudget;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not in the block (yet).
    Outside,
    /// In the block, with this many tokens generated in it.
    Inside(usize),
    /// The budget is spent: the closing tag's token at this index is next.
    Closing(usize),
    /// The block closed: nothing more to do.
    Done,
}

/// One sequence's thinking budget.
#[derive(Debug, Clone)]
pub struct BudgetGate {
    budget: ThinkingBudget,
    phase: Phase,
    /// The latest generated tokens, as many as the longer tag has.
    recent: Vec<u32>,
}

impl BudgetGate {
    pub fn new(budget: ThinkingBudget) -> Self {
        let phase = match budget.starts_open {
            true => Self::inside(&budget, 0),
            false => Phase::Outside,
        };
        BudgetGate {
            budget,
            phase,
            recent: Vec::new(),
        }
    }

    /// `Inside(n)`, or `Closing` when `n` spends the budget.
    fn inside(budget: &ThinkingBudget, n: usize) -> Phase {
        match n >= budget.tokens && !budget.close.is_empty() {
            true => Phase::Closing(0),
            false => Phase::Inside(n),
        }
    }

    /// The token the next step must take, while the closing tag is being forced.
    pub fn forced(&self) -> Option<u32> {
        match self.phase {
            Phase::Closing(i) => self.budget.close.get(i).copied(),
            _ => None,
        }
    }

    /// Records the sequence's next token.
    pub fn accept(&mut self, token: u32) {
        let keep = self.budget.open.len().max(self.budget.close.len());
        self.recent.push(token);
        if self.recent.len() > keep {
            self.recent.remove(0);
        }
        let ends_with = |tag: &[u32]| !tag.is_empty() && self.recent.ends_with(tag);
        self.phase = match self.phase {
            Phase::Outside if ends_with(&self.budget.open) => Self::inside(&self.budget, 0),
            Phase::Outside => Phase::Outside,
            Phase::Inside(_) if ends_with(&self.budget.close) => Phase::Done,
            Phase::Inside(n) => Self::inside(&self.budget, n + 1),
            Phase::Closing(i) if i + 1 >= self.budget.close.len() => Phase::Done,
            Phase::Closing(i) => Phase::Closing(i + 1),
            Phase::Done => Phase::Done,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(tokens: usize, starts_open: bool) -> BudgetGate {
        BudgetGate::new(ThinkingBudget {
            tokens,
            open: vec![10],
            close: vec![11, 12],
            starts_open,
        })
    }

    #[test]
    fn the_close_is_forced_once_the_budget_is_spent() {
        let mut g = gate(3, false);
        g.accept(10);
        for t in [1, 2] {
            assert_eq!(g.forced(), None);
            g.accept(t);
        }
        g.accept(3);
        assert_eq!(g.forced(), Some(11));
        g.accept(11);
        assert_eq!(g.forced(), Some(12));
        g.accept(12);
        assert_eq!(g.forced(), None);
        g.accept(10);
        assert_eq!(g.forced(), None, "one block only");
    }

    #[test]
    fn a_block_closed_in_time_is_left_alone_and_a_zero_budget_closes_at_once() {
        let mut g = gate(5, true);
        g.accept(1);
        g.accept(11);
        g.accept(12);
        for t in 0..10 {
            g.accept(t);
            assert_eq!(g.forced(), None);
        }
        let g = gate(0, true);
        assert_eq!(g.forced(), Some(11));
        let mut g = gate(0, false);
        assert_eq!(g.forced(), None);
        g.accept(10);
        assert_eq!(g.forced(), Some(11));
    }
}
