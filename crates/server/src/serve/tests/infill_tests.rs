//! `suffix` on `/v1/completions`: the prompt the engine receives is the vocabulary's
//! fill-in-the-middle layout (Qwen's prefix first, Mistral's suffix first, as their model
//! cards write it), and requests that cannot be honoured are refused by name. The
//! tokenizers are fetched into the cache by `scripts/make-token-fixtures fetch`; without
//! them these tests skip, saying so.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::json;
use tessera_protocol::{
    Executor, ExecutorError, KvCacheShape, SampledToken, SeqId, StepOutput, StepPlan,
};
use tessera_tokenizer::Tokenizer;

use super::harness::*;

/// Samples `script[k]` for a sequence's `k`-th token (the last entry from then on) and
/// keeps the prompt of every sequence it is given.
struct RecordingExecutor {
    script: Vec<u32>,
    sampled: HashMap<SeqId, usize>,
    prompts: Arc<Mutex<Vec<Vec<u32>>>>,
}

impl Executor for RecordingExecutor {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        let mut prompts = self.prompts.lock().unwrap();
        prompts.extend(plan.new_sequences.iter().map(|n| n.prompt_ids.clone()));
        let mut samples = Vec::new();
        for chunk in plan.scheduled.iter().filter(|c| c.sample) {
            let k = self.sampled.entry(chunk.id).or_default();
            let token = self.script[(*k).min(self.script.len() - 1)];
            *k += 1;
            samples.push(SampledToken {
                id: chunk.id,
                token,
                logprobs: None,
                prompt_logprobs: None,
                embedding: None,
                accepted: Vec::new(),
                proposed: Vec::new(),
            });
        }
        Ok(StepOutput {
            samples,
            failed: Vec::new(),
            draft: None,
        })
    }
    fn kv_cache_shape(&self) -> KvCacheShape {
        KvCacheShape::new(256, 16)
    }
    fn max_context_tokens(&self) -> usize {
        4096
    }
}

fn cached_tokenizer(name: &str) -> Option<Arc<Tokenizer>> {
    let dir = crate::test_fixtures::cached_tokenizer_dir(name)?;
    Some(Arc::new(Tokenizer::from_hf_dir(&dir).unwrap()))
}

/// A server of `tokenizer` over a recording executor that samples `script`.
fn scripted_server(
    tokenizer: &Arc<Tokenizer>,
    script: Vec<u32>,
) -> (TestServer, Arc<Mutex<Vec<Vec<u32>>>>) {
    let prompts = Arc::new(Mutex::new(Vec::new()));
    let executor = RecordingExecutor {
        script,
        sampled: HashMap::new(),
        prompts: Arc::clone(&prompts),
    };
    let state = fake_state_with_tokenizer(executor, Arc::clone(tokenizer), 256, 4096, 16);
    (start(state, &[]), prompts)
}

/// A server of `tokenizer` whose every token is " x".
fn recording_server(tokenizer: &Arc<Tokenizer>) -> (TestServer, Arc<Mutex<Vec<Vec<u32>>>>) {
    let x = tokenizer.encode(" x", false).unwrap()[0];
    scripted_server(tokenizer, vec![x])
}

const PREFIX: &str = "def add(a, b):\n    return ";
const SUFFIX: &str = "\n\nprint(add(1, 2))\n";

#[tokio::test]
async fn qwen_fills_in_the_middle_prefix_first() {
    let Some(tokenizer) = cached_tokenizer("qwen3") else {
        return;
    };
    let (s, prompts) = recording_server(&tokenizer);
    let (status, out) = post(
        &s.url("/v1/completions"),
        &json!({"model": "fake", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 3,
                "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["choices"][0]["text"], " x x x");
    // Qwen2.5-Coder's model card: <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>.
    let card = format!("<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>");
    let want = tokenizer.encode(&card, false).unwrap();
    assert_eq!(want.first(), Some(&151659));
    assert_eq!(want.last(), Some(&151660));
    assert_eq!(
        prompts.lock().unwrap().as_slice(),
        std::slice::from_ref(&want)
    );
    assert_eq!(out["usage"]["prompt_tokens"], want.len());

    // Streamed, and with two prompts sharing the suffix: the same layout for each.
    let (status, events) = post_sse(
        &s.url("/v1/completions"),
        &json!({"model": "fake", "prompt": [PREFIX, "x = "], "suffix": SUFFIX,
                "max_tokens": 2, "stream": true}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let second = tokenizer
        .encode(
            &format!("<|fim_prefix|>x = <|fim_suffix|>{SUFFIX}<|fim_middle|>"),
            false,
        )
        .unwrap();
    let mut recorded = prompts.lock().unwrap()[1..].to_vec();
    recorded.sort();
    let mut expected = vec![want, second];
    expected.sort();
    assert_eq!(recorded, expected);
}

#[tokio::test]
async fn mistral_fills_in_the_middle_suffix_first() {
    let Some(tokenizer) = cached_tokenizer("mistral_nemo") else {
        return;
    };
    let (s, prompts) = recording_server(&tokenizer);
    let (status, out) = post(
        &s.url("/v1/completions"),
        &json!({"model": "fake", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    // mistral-common's encode_fim: <s>[SUFFIX]{suffix}[PREFIX]{prefix}.
    let layout = format!("<s>[SUFFIX]{SUFFIX}[PREFIX]{PREFIX}");
    let want = tokenizer.encode(&layout, false).unwrap();
    assert_eq!(&want[..2], &[1, 13]);
    assert_eq!(prompts.lock().unwrap().as_slice(), &[want]);
}

#[tokio::test]
async fn what_cannot_surround_the_middle_is_refused_by_name() {
    let Some(tokenizer) = cached_tokenizer("qwen3") else {
        return;
    };
    let (s, prompts) = recording_server(&tokenizer);
    let url = s.url("/v1/completions");
    for (extra, param) in [
        (json!({"echo": true}), "echo"),
        (json!({"prompt": [1, 2, 3]}), "suffix"),
        (json!({"prompt": [[1, 2]]}), "suffix"),
        (
            json!({"truncate_prompt_tokens": 8}),
            "truncate_prompt_tokens",
        ),
        (json!({"suffix": 7}), "suffix"),
    ] {
        let mut body = json!({"model": "fake", "prompt": PREFIX, "suffix": SUFFIX,
                              "max_tokens": 1});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, out) = post(&url, &body).await;
        assert_error(status, &out, 400, Some(param));
    }
    assert!(prompts.lock().unwrap().is_empty());
    // An empty suffix is the field's default: an ordinary completion.
    let (status, out) = post(
        &url,
        &json!({"model": "fake", "prompt": PREFIX, "suffix": "", "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(
        prompts.lock().unwrap().as_slice(),
        &[tokenizer.encode(PREFIX, true).unwrap()]
    );
}

#[tokio::test]
async fn a_vocabulary_without_the_tokens_says_so() {
    // SmolLM2's vocabulary has no fill-in-the-middle tokens.
    let s = fake_server(None, 64, 16);
    let (status, out) = post(
        &s.url("/v1/completions"),
        &json!({"model": "fake", "prompt": "Hi", "suffix": "end", "max_tokens": 1}),
    )
    .await;
    assert_error(status, &out, 400, Some("suffix"));
    let message = out["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("no fill-in-the-middle tokens"),
        "{message}"
    );
}

#[tokio::test]
async fn a_file_separator_ends_an_infill_and_only_an_infill() {
    let Some(tokenizer) = cached_tokenizer("qwen3") else {
        return;
    };
    let token = |text: &str| tokenizer.token_to_id(text).unwrap();
    let x = tokenizer.encode(" x", false).unwrap()[0];
    let y = tokenizer.encode(" y", false).unwrap()[0];
    let (s, _) = scripted_server(&tokenizer, vec![x, y, token("<|file_sep|>"), x]);
    let url = s.url("/v1/completions");
    let (status, out) = post(
        &url,
        &json!({"model": "fake", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 8}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["choices"][0]["text"], " x y");
    assert_eq!(out["choices"][0]["finish_reason"], "stop");
    // Without a suffix the separator is an ordinary token of the text.
    let (status, out) = post(
        &url,
        &json!({"model": "fake", "prompt": PREFIX, "max_tokens": 5}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["choices"][0]["text"], " x y<|file_sep|> x x");
    assert_eq!(out["choices"][0]["finish_reason"], "length");
}
