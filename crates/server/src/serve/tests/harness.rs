//! Test servers and HTTP helpers.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use clap::Parser;
use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::PrometheusValue;
use reqwest::StatusCode;
use serde_json::Value;
use tessera_protocol::{Executor, ExecutorError, KvCacheShape, SampledToken, StepOutput, StepPlan};
use tessera_scheduler::{EngineLoop, SchedulerConfig};

use crate::api::models::ServedNames;
use crate::api::params::grammar::GrammarService;
use crate::api::params::limits::RequestLimits;
use crate::api::valid_request::ValidationContext;
use crate::serve::connection::{ConnTimeouts, LimitedListener};
use crate::serve::lifecycle::Lifecycle;
use crate::serve::limits::ServerLimits;
use crate::serve::metrics::ServerMetrics;
use crate::serve::state::{unix_now, AppState};
use crate::serve::{front_of, load_state, routes, serve_http, warm_up, ServeArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

pub fn serve_args(extra: &[&str]) -> ServeArgs {
    let mut argv = vec!["tessera", "--served-model-name", "smollm2"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).expect("test args parse").args
}

/// A running server: its base URL and state.
pub struct TestServer {
    pub base: String,
    pub state: AppState,
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Serve `state` on 127.0.0.1:0 from a thread of its own, for the rest of the process.
pub fn start(state: AppState, allowed_origins: &[String]) -> TestServer {
    let app = routes::build_router(state.clone(), allowed_origins);
    TestServer {
        base: serve_router(app),
        state,
    }
}

/// Serve `app` on 127.0.0.1:0 from a thread of its own; its base URL.
pub fn serve_router(app: axum::Router) -> String {
    serve_router_limited(app, None)
}

/// As [`serve_router`], with at most `max_connections` connections (default 1024) and
/// the default connection timeouts.
pub fn serve_router_limited(app: axum::Router, max_connections: Option<usize>) -> String {
    serve_router_with(
        app,
        max_connections.unwrap_or(1024),
        ConnTimeouts::default(),
    )
}

/// As [`serve_router`], with the given connection limit and timeouts, through the same
/// listener and serving function as `tessera serve`.
pub fn serve_router_with(
    app: axum::Router,
    max_connections: usize,
    timeouts: ConnTimeouts,
) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let listener = LimitedListener::new(listener, max_connections, timeouts);
            serve_http(listener, app, std::future::pending())
                .await
                .unwrap();
        });
    });
    let addr: std::net::SocketAddr = rx.recv().unwrap();
    format!("http://{addr}")
}

/// The real model, loaded once.
pub fn model_state() -> &'static AppState {
    static STATE: OnceLock<AppState> = OnceLock::new();
    STATE.get_or_init(|| {
        let args = serve_args(&["--kv-cache-memory-mib", "64", "--max-model-len", "2048"]);
        let front = front_of(&args).expect("the layers' settings");
        let state = load_state(&args, Arc::new(Lifecycle::default()), &front)
            .expect("load the SmolLM2 model (run scripts/fetch-model)");
        // Warm-up blocks on the scheduler's channel: not on a runtime thread.
        let warm = state.clone();
        std::thread::spawn(move || warm_up(&warm))
            .join()
            .unwrap()
            .expect("warm-up generation");
        state.lifecycle.set_started();
        state
    })
}

/// The shared real-model server without keys or CORS.
pub fn model_server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| start(model_state().clone(), &[]))
}

/// Real-model tests read the scheduler's metrics only under the write side, so nothing
/// else runs on the shared scheduler meanwhile.
pub static SCHEDULER_GATE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

pub async fn post(url: &str, body: &Value) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

pub async fn get(url: &str) -> (StatusCode, Value) {
    let resp = reqwest::get(url).await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

/// POST and read a whole SSE stream: the `data:` payloads in order.
pub async fn post_sse(url: &str, body: &Value) -> (StatusCode, Vec<String>) {
    let resp = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (status, sse_data(&text))
}

pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// Assert an OpenAI error envelope with this status and `param`.
pub fn assert_error(status: StatusCode, body: &Value, want: u16, param: Option<&str>) {
    assert_eq!(status.as_u16(), want, "{body}");
    let error = &body["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
    assert!(
        error.get("code").is_some() && error.get("param").is_some(),
        "{body}"
    );
    if let Some(p) = param {
        assert_eq!(error["param"], p, "{body}");
    }
}

/// A fake executor: every sampled token is `token`; step number `fail_at` (1-based)
/// fails, and so does every step from `fail_from` on; step `panic_at` panics.
pub struct FakeExecutor {
    pub token: u32,
    pub fail_at: Option<u64>,
    pub fail_from: Option<u64>,
    pub panic_at: Option<u64>,
    /// Sleep this long in every step (a slow device).
    pub step_delay: Option<std::time::Duration>,
    pub steps: u64,
    pub kv: KvCacheShape,
}

impl Executor for FakeExecutor {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        self.steps += 1;
        if let Some(d) = self.step_delay {
            std::thread::sleep(d);
        }
        if Some(self.steps) == self.panic_at {
            panic!("fake executor panics at step {}", self.steps);
        }
        if Some(self.steps) == self.fail_at || self.fail_from.is_some_and(|f| self.steps >= f) {
            return Err(ExecutorError::step(
                Some(0),
                "SECRET-INTERNAL-DETAIL device fell over",
            ));
        }
        Ok(StepOutput {
            samples: plan
                .scheduled
                .iter()
                .filter(|c| c.sample)
                .map(|c| SampledToken {
                    id: c.id,
                    token: self.token,
                    logprobs: None,
                    prompt_logprobs: None,
                    embedding: None,
                    accepted: Vec::new(),
                    proposed: Vec::new(),
                })
                .collect(),
            failed: Vec::new(),
            draft: None,
        })
    }
    fn kv_cache_shape(&self) -> KvCacheShape {
        self.kv
    }
    fn max_context_tokens(&self) -> usize {
        1024
    }
}

/// A server over a fake executor, with the real tokenizer.
pub fn fake_server(fail_at: Option<u64>, num_blocks: usize, max_waiting: usize) -> TestServer {
    fake_server_with(
        FakeExecutor {
            token: 0,
            fail_at,
            fail_from: None,
            panic_at: None,
            step_delay: None,
            steps: 0,
            kv: KvCacheShape::new(num_blocks, 16),
        },
        max_waiting,
    )
}

/// The token id of " hello", which fake executors sample.
pub fn hello_token() -> u32 {
    model_state()
        .validation
        .tokenizer
        .encode(" hello", false)
        .unwrap()[0]
}

/// A started server over `executor` (its `token` replaced by " hello").
pub fn fake_server_with(mut executor: FakeExecutor, max_waiting: usize) -> TestServer {
    let num_blocks = executor.kv.num_blocks;
    executor.token = hello_token();
    start(fake_state(executor, num_blocks, 1024, max_waiting), &[])
}

/// The state of a started server over `executor`, with the real tokenizer, serving
/// the model "fake" with a context of `max_model_len` tokens.
pub fn fake_state<E: Executor + 'static>(
    executor: E,
    num_blocks: usize,
    max_model_len: usize,
    max_waiting: usize,
) -> AppState {
    let tokenizer = Arc::clone(&model_state().validation.tokenizer);
    fake_state_with_tokenizer(executor, tokenizer, num_blocks, max_model_len, max_waiting)
}

/// As [`fake_state`], with `tokenizer` in place of the real model's.
pub fn fake_state_with_tokenizer<E: Executor + 'static>(
    executor: E,
    tokenizer: Arc<tessera_tokenizer::Tokenizer>,
    num_blocks: usize,
    max_model_len: usize,
    max_waiting: usize,
) -> AppState {
    let scheduler = EngineLoop::spawn(
        SchedulerConfig {
            max_waiting,
            ..SchedulerConfig::default()
        },
        executor,
    )
    .unwrap();
    let lifecycle = Arc::new(Lifecycle::default());
    lifecycle.set_loaded(scheduler.clone());
    lifecycle.set_started();
    AppState {
        runner: Default::default(),
        scheduler,
        validation: Arc::new(ValidationContext {
            vocab_rows: tokenizer.vocab_size(),
            tokenizer,
            served_model_names: ServedNames::new(&["fake".into()], "fake".into()),
            max_model_len,
            kv_sequence_tokens: num_blocks * 16,
            limits: RequestLimits::default(),
            grammar: GrammarService::new(
                Err("the fake executor has no grammar compiler".into()),
                Default::default(),
            ),
            tool_parser: None,
            reasoning: Default::default(),
            work_slots: Default::default(),
        }),
        api_keys: Arc::new(Vec::new()),
        max_body_bytes: 1 << 20,
        limits: ServerLimits::default(),
        started_unix: unix_now(),
        lifecycle,
        metrics: Arc::new(ServerMetrics::default()),
        engine_stats: None,
        ui: true,
    }
}

/// The France question, greedy.
pub fn france(extra: Value) -> Value {
    let mut body = serde_json::json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        "temperature": 0,
        "max_tokens": 16
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

/// The server's `/metrics` text.
pub async fn metrics_text(s: &TestServer) -> String {
    reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The server's `/metrics`, parsed and flattened by [`scrape`].
pub async fn scraped_metrics(s: &TestServer) -> BTreeMap<String, f64> {
    scrape(&metrics_text(s).await)
}

/// Parse with a real text-format parser and flatten: `name{k="v",…}` → value, with
/// histograms as `name_count`/`name_sum` (and buckets as `name_bucket{…le="…"}`).
pub fn scrape(text: &str) -> BTreeMap<String, f64> {
    let exposition = parse_prometheus(text).expect("valid Prometheus text format");
    let mut out = BTreeMap::new();
    for (name, family) in &exposition.families {
        let label_names = family.get_label_names().to_vec();
        for sample in family.iter_samples() {
            let labelset = sample.get_labelset().unwrap();
            let labels: Vec<String> = label_names
                .iter()
                .filter(|l| *l != "model_name")
                .map(|l| format!("{l}=\"{}\"", labelset.get_label_value(l).unwrap_or("")))
                .collect();
            let key = |suffix: &str| {
                if labels.is_empty() {
                    format!("{name}{suffix}")
                } else {
                    format!("{name}{suffix}{{{}}}", labels.join(","))
                }
            };
            match &sample.value {
                PrometheusValue::Gauge(v) | PrometheusValue::Unknown(v) => {
                    out.insert(key(""), v.as_f64());
                }
                PrometheusValue::Counter(c) => {
                    out.insert(key(""), c.value.as_f64());
                }
                PrometheusValue::Histogram(h) => {
                    out.insert(key("_count"), h.count.unwrap_or(0) as f64);
                    out.insert(key("_sum"), h.sum.as_ref().map_or(0.0, |s| s.as_f64()));
                    let last = h.buckets.last().expect("histogram buckets");
                    assert!(last.upper_bound.is_infinite(), "{name}: +Inf bucket last");
                    assert_eq!(last.count.as_f64(), h.count.unwrap_or(0) as f64, "{name}");
                }
                PrometheusValue::Summary(_) => panic!("no summaries expected: {name}"),
            }
        }
    }
    out
}
