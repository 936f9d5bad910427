//! The executor `serve` hands the scheduler: the model alone, or with a draft model
//! guessing its tokens (`--speculative-config` with `draft_model`).

use std::path::Path;

use anyhow::{bail, Context, Result};
use tessera_engine::{load_drafted, Drafted, Engine, EngineConfig, Tokenizer};
use tessera_protocol::{Executor, ExecutorError, KvCacheShape, StepOutput, StepPlan};

pub enum ServedEngine {
    Alone(Box<Engine>),
    Drafted(Box<Drafted<Engine, Engine>>),
}

impl ServedEngine {
    /// Loads the model of `cfg`, and the draft model when one is named: its tokenizer
    /// must be the model's (`tokenizer`), or guesses would mean other tokens.
    pub fn load(cfg: &EngineConfig, draft: Option<&Path>, tokenizer: &Tokenizer) -> Result<Self> {
        let Some(draft) = draft else {
            let engine = Engine::load(cfg).context("loading the model")?;
            return Ok(Self::Alone(Box::new(engine)));
        };
        same_tokenizer(tokenizer, &cfg.model_path, draft)?;
        let drafted = load_drafted(cfg, draft).context("loading the model and its draft")?;
        Ok(Self::Drafted(Box::new(drafted)))
    }

    /// The served model.
    pub fn target(&self) -> &Engine {
        match self {
            Self::Alone(e) => e,
            Self::Drafted(d) => d.target(),
        }
    }

    pub fn target_mut(&mut self) -> &mut Engine {
        match self {
            Self::Alone(e) => e,
            Self::Drafted(d) => d.target_mut(),
        }
    }
}

/// Refuses a draft whose tokenizer is not `tokenizer` (the model's), naming both.
fn same_tokenizer(tokenizer: &Tokenizer, model: &Path, draft: &Path) -> Result<()> {
    let theirs = tessera_engine::load_tokenizer(draft).with_context(|| {
        format!(
            "loading the draft model's tokenizer from {}",
            draft.display()
        )
    })?;
    let differs = |why: String| {
        anyhow::anyhow!(
            "the draft model {} has a tokenizer other than the model's ({}): {why}; a draft \
             must share the model's tokenizer",
            draft.display(),
            model.display()
        )
    };
    if theirs.vocab_size() != tokenizer.vocab_size() {
        return Err(differs(format!(
            "{} tokens against {}",
            theirs.vocab_size(),
            tokenizer.vocab_size()
        )));
    }
    for id in 0..tokenizer.vocab_size() as u32 {
        let (ours, draft_token) = (tokenizer.id_to_token(id), theirs.id_to_token(id));
        if ours != draft_token {
            return Err(differs(format!(
                "token {id} is {draft_token:?} against {ours:?}"
            )));
        }
    }
    if tokenizer.vocab_size() == 0 {
        bail!("the model's tokenizer has no tokens");
    }
    Ok(())
}

impl Executor for ServedEngine {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        match self {
            Self::Alone(e) => e.step(plan),
            Self::Drafted(d) => d.step(plan),
        }
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        match self {
            Self::Alone(e) => e.kv_cache_shape(),
            Self::Drafted(d) => d.kv_cache_shape(),
        }
    }

    fn max_context_tokens(&self) -> usize {
        match self {
            Self::Alone(e) => e.max_context_tokens(),
            Self::Drafted(d) => d.max_context_tokens(),
        }
    }
}
