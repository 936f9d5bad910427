//! The executor `serve` hands the scheduler: the model alone, or with a draft model
//! guessing its tokens (`--speculative-config` with `draft_model`).

use std::path::Path;

use anyhow::{Context, Result};
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::path::PathBuf;

    use super::same_tokenizer;

    fn smollm2_tokenizer() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/smollm2-hf")
    }

    #[test]
    fn a_draft_with_another_tokenizer_is_refused_naming_both() {
        let dir = smollm2_tokenizer();
        let ours = tessera_engine::load_tokenizer(&dir).unwrap();
        let model = PathBuf::from("/models/target");
        same_tokenizer(&ours, &model, &dir).unwrap();
        // The same tokenizer with one special token renamed.
        let other = std::env::temp_dir().join(format!("draft-tokenizer-{}", std::process::id()));
        std::fs::create_dir_all(&other).unwrap();
        let text = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap();
        assert!(text.contains("<empty_output>"));
        std::fs::write(
            other.join("tokenizer.json"),
            text.replace("<empty_output>", "<other_output>"),
        )
        .unwrap();
        std::fs::copy(
            dir.join("tokenizer_config.json"),
            other.join("tokenizer_config.json"),
        )
        .unwrap();
        let err = same_tokenizer(&ours, &model, &other)
            .unwrap_err()
            .to_string();
        std::fs::remove_dir_all(&other).unwrap();
        assert!(err.contains("/models/target"), "{err}");
        assert!(err.contains(&other.display().to_string()), "{err}");
        assert!(err.contains("token 16 is"), "{err}");
        assert!(
            err.contains("<other_output>") && err.contains("<empty_output>"),
            "{err}"
        );
    }
}
