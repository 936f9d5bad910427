//! The real tokenizer of the default model (SmolLM2), loaded once per process.

use std::sync::{Arc, OnceLock};

use tessera_engine::load_tokenizer;
use tessera_engine::loader::default_model_path;
use tessera_tokenizer::Tokenizer;

/// The default model's tokenizer. Panics when the model is missing: fetch it with
/// `scripts/fetch-model` (every fuzz run and `scripts/test` need it).
pub fn tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    let tokenizer = TOKENIZER.get_or_init(|| {
        let path = default_model_path();
        match load_tokenizer(&path) {
            Ok(t) => Arc::new(t),
            Err(e) => panic!(
                "cannot load the tokenizer of {} (run scripts/fetch-model): {e}",
                path.display()
            ),
        }
    });
    Arc::clone(tokenizer)
}

/// A runtime for the async validation (it tokenizes on the blocking pool).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        // Timers: structured output compiles under a time limit.
        match tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .enable_time()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => panic!("cannot start a tokio runtime: {e}"),
        }
    })
}
