//! The flags of `tessera serve` (each also a `TESSERA_*` variable and a config key), and
//! the limits and defaults derived from them.

use std::time::Duration;

use clap::Args;
use tessera_engine::DeviceSpec;

use tessera_engine::structured::GrammarBounds;

use crate::api::params::grammar::GrammarLimits;
use crate::api::params::limits::RequestLimits;
use crate::config_layers::Derived;
use crate::help_headings::{CONFIG, HTTP, LIMITS, MODEL};
use crate::model_args::{ModelArgs, DEFAULT_CPU_KV_CACHE_MIB};
use crate::serve::connection::ConnTimeouts;
#[cfg(feature = "fault-injection")]
use crate::serve::fault_injection;
use crate::serve::limits::ServerLimits;

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", help_heading = HTTP)]
    pub host: String,

    /// Port to listen on (0 picks a free one; default 8000). A worker node of a group
    /// (`--node-rank` above 0) serves its probes on it only when it is given.
    #[arg(long, help_heading = HTTP)]
    pub port: Option<u16>,

    /// Names clients may send in `model`, several allowed (space- or comma-separated);
    /// replies report the first (default: the model file's stem, or a hub model's
    /// `org/repo[:TAG]` as given).
    #[arg(long, num_args = 1.., value_delimiter = ',', help_heading = HTTP)]
    pub served_model_name: Vec<String>,

    /// Accepted API key (repeatable; comma-separated in TESSERA_API_KEY). Without
    /// one, no authentication.
    #[arg(
        long = "api-key",
        env = "TESSERA_API_KEY",
        value_delimiter = ',',
        hide_env_values = true,
        help_heading = HTTP
    )]
    pub api_keys: Vec<String>,

    /// A file of accepted API keys, one per line (`#` comments allowed); added to
    /// `--api-key`. Keeps keys out of the process list and the environment.
    #[arg(long, help_heading = HTTP)]
    pub api_key_file: Option<std::path::PathBuf>,

    /// How tool calls are found in replies under `tool_choice` "auto": hermes,
    /// llama3_json, mistral, glm45, qwen3_coder or minimax_m2 (default: chosen from the
    /// chat template).
    #[arg(long, help_heading = MODEL)]
    pub tool_call_parser: Option<crate::api::tools::parsers::ToolParserKind>,

    /// How a chat reply's thinking is split from its answer into `reasoning` (and
    /// `reasoning_content`): auto (by harmony channels when the chat template writes
    /// them, as gpt-oss's does; at <think>...</think> when it knows such blocks), think
    /// (always at <think>; qwen3 and deepseek_r1 are names for it), harmony (always by
    /// channels; openai_gptoss is a name for it) or none.
    #[arg(long, default_value_t = crate::api::reasoning::ReasoningParser::Auto, help_heading = MODEL)]
    pub reasoning_parser: crate::api::reasoning::ReasoningParser,

    /// Serve no chat page at `/` (it is on by default; it needs no build and asks for
    /// the API key itself).
    #[arg(long, help_heading = HTTP)]
    pub no_ui: bool,

    /// What the model is served for: generate (chat, completions, Responses, Messages)
    /// or pooling (an embedding model: /v1/embeddings, vLLM's name).
    #[arg(long, value_enum, default_value_t = crate::runner::RunnerKind::Generate, help_heading = MODEL)]
    pub runner: crate::runner::RunnerKind,

    /// How an embedding model (--runner pooling) pools its final hidden states: last,
    /// mean or cls (default: from the model's sentence-transformers files, else a GGUF
    /// file's pooling_type, else last).
    #[arg(long, value_enum, help_heading = MODEL)]
    pub pooling: Option<crate::runner::PoolingFlag>,

    /// Scale embeddings to unit length (--runner pooling): true or false.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, help_heading = MODEL)]
    pub embedding_normalize: bool,

    /// Speculative decoding, as vLLM's JSON: {"method": "ngram", "num_speculative_tokens":
    /// K, "prompt_lookup_min": A, "prompt_lookup_max": B, "disable_by_batch_size": N}
    /// guesses up to K tokens after each decoding sequence from the latest earlier
    /// occurrence of its last B..A tokens, in steps of at most N decoding sequences
    /// (default 8); {"method": "draft_model", "model": PATH, "num_speculative_tokens": K}
    /// has a smaller model with the same tokenizer guess them (on the first device);
    /// {"method": "mtp", "num_speculative_tokens": K} has the model's own
    /// multi-token-prediction layer guess them (GLM-4.5's). Output is unchanged, token
    /// for token. Off by default.
    #[arg(long, help_heading = LIMITS)]
    pub speculative_config: Option<String>,

    /// Origins allowed by CORS, comma-separated, or `*`. CORS is off by default.
    #[arg(long, value_delimiter = ',', help_heading = HTTP)]
    pub allowed_origins: Vec<String>,

    /// Most sequences running at once.
    #[arg(long, default_value_t = 64, help_heading = LIMITS)]
    pub max_num_seqs: usize,

    /// Most tokens run through the model in one step; longer prompts are prefilled in
    /// chunks between decode steps (default: 256 when every rank is a CPU, where a step
    /// of 2048 prompt tokens takes seconds and stalls every running stream; 2048 on GPUs).
    #[arg(long, help_heading = LIMITS)]
    pub max_batch_tokens: Option<usize>,

    /// Most requests waiting to start; more are refused with 429.
    #[arg(long, default_value_t = 256, help_heading = LIMITS)]
    pub max_waiting: usize,

    /// Longest context (prompt + completion) in tokens (default: the model's, and at
    /// most that). It also sizes the RoPE tables, and picks LongRoPE's factors (Phi-3.5,
    /// Phi-4-mini): the short ones when it is within the model's pretraining context.
    #[arg(long, help_heading = LIMITS)]
    pub max_model_len: Option<usize>,

    /// Largest request body in bytes; more is refused with 413.
    #[arg(long, default_value_t = 4 << 20, help_heading = LIMITS)]
    pub max_body_bytes: usize,

    /// Largest total size of the request headers in bytes; more is refused with 431.
    #[arg(long, default_value_t = 32 << 10, help_heading = LIMITS)]
    pub max_header_bytes: usize,

    /// Most connections open at once. When all are taken, the one that has waited
    /// longest without a request in progress is closed for a new one; when every one
    /// serves a request, more are answered 503 and closed. Capped to fit the open-file
    /// limit (which start-up raises to its hard limit).
    #[arg(long, default_value_t = 1024, help_heading = LIMITS)]
    pub max_connections: usize,

    /// Seconds a request head may take to arrive, from the connection's accept (or the
    /// next request's first byte); past it the connection gets a 408 and is closed
    /// (0: no limit).
    #[arg(long, default_value_t = crate::serve::connection::DEFAULT_HEADER_READ_TIMEOUT_SECS, help_heading = LIMITS)]
    pub header_read_timeout: u64,

    /// Seconds a kept-alive connection may wait for its next request before it is
    /// closed (0: no limit).
    #[arg(long, default_value_t = crate::serve::connection::DEFAULT_KEEP_ALIVE_TIMEOUT_SECS, help_heading = LIMITS)]
    pub keep_alive_timeout: u64,

    /// Seconds from a request's head to the last byte of its body; past it: 408
    /// (0: only --request-timeout bounds it).
    #[arg(long, default_value_t = crate::serve::limits::DEFAULT_BODY_READ_TIMEOUT_SECS, help_heading = LIMITS)]
    pub body_read_timeout: u64,

    /// Longest wall time of a request, streams included, in seconds (0: no limit).
    /// Past it the request is cancelled and answered 408 (or, mid-stream, a
    /// `request_timeout` error event).
    #[arg(long, default_value_t = 600, help_heading = LIMITS)]
    pub request_timeout: u64,

    /// Most choices per request (`n` times the number of prompts); more: 400.
    #[arg(long, default_value_t = 16, help_heading = LIMITS)]
    pub max_choices: usize,

    /// Most stop strings per request; more: 400.
    #[arg(long, default_value_t = 16, help_heading = LIMITS)]
    pub max_stop_strings: usize,

    /// Longest stop string in bytes; longer: 400.
    #[arg(long, default_value_t = 256, help_heading = LIMITS)]
    pub max_stop_string_bytes: usize,

    /// Most `logit_bias` entries per request; more: 400.
    #[arg(long, default_value_t = 300, help_heading = LIMITS)]
    pub max_logit_bias: usize,

    /// Largest structured output format (a JSON schema, grammar, regex or choice list)
    /// in bytes; larger: 400.
    #[arg(long, default_value_t = tessera_engine::structured::bounds::DEFAULT_MAX_GRAMMAR_BYTES, help_heading = LIMITS)]
    pub max_grammar_bytes: usize,

    /// Deepest nesting of a structured output format (nested schema values, `$ref`
    /// hops, grammar rule chains); deeper: 400.
    #[arg(long, default_value_t = tessera_engine::structured::bounds::DEFAULT_MAX_GRAMMAR_DEPTH, help_heading = LIMITS)]
    pub max_grammar_depth: usize,

    /// Seconds a structured output format may take to compile (waiting for a free
    /// compiler included); longer: 400 (too complex), or 503 when other formats kept
    /// every compiler busy.
    #[arg(long, default_value_t = crate::api::params::grammar::DEFAULT_COMPILE_TIMEOUT_SECS, help_heading = LIMITS)]
    pub grammar_compile_timeout: u64,

    /// Events a streamed response buffers for a client that reads slowly.
    #[arg(long, default_value_t = 64, help_heading = LIMITS)]
    pub stream_buffer_events: usize,

    /// Seconds a streamed response's buffer may stay full (the client reads nothing)
    /// before the request is cancelled.
    #[arg(long, default_value_t = 30, help_heading = LIMITS)]
    pub stream_stall_timeout: u64,

    /// Seconds running requests get to finish after SIGTERM/Ctrl-C before they are
    /// aborted.
    #[arg(long, default_value_t = 30, help_heading = HTTP)]
    pub shutdown_timeout: u64,

    /// A TOML file of settings (keys are these flags' names with `_`, e.g.
    /// `max_num_seqs`). Precedence: file < environment `TESSERA_<KEY>` < flags.
    #[arg(long, env = "TESSERA_CONFIG", help_heading = CONFIG)]
    pub config: Option<std::path::PathBuf>,

    /// Print the effective configuration (after file, environment and flags) as TOML
    /// and exit.
    #[arg(long, help_heading = CONFIG)]
    pub print_config: bool,

    /// Test hook: make device rank RANK fail (KIND error|panic|hang) after AFTER_STEPS
    /// steps. Only in builds with the `fault-injection` feature.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true, value_name = "RANK:KIND:AFTER_STEPS")]
    pub inject_fault: Option<fault_injection::FaultSpec>,
}

impl ServeArgs {
    /// The limits on `n`, `stop` and `logit_bias`.
    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            max_choices: self.max_choices,
            max_stop_strings: self.max_stop_strings,
            max_stop_string_bytes: self.max_stop_string_bytes,
            max_logit_bias: self.max_logit_bias,
        }
    }

    /// How long connections may wait for request heads.
    pub fn conn_timeouts(&self) -> ConnTimeouts {
        ConnTimeouts {
            header_read: secs(self.header_read_timeout),
            keep_alive: secs(self.keep_alive_timeout),
        }
    }

    /// The bounds of structured output formats and the time they may take to compile.
    pub fn grammar_limits(&self) -> GrammarLimits {
        GrammarLimits {
            bounds: GrammarBounds {
                max_bytes: self.max_grammar_bytes,
                max_depth: self.max_grammar_depth,
            },
            compile_timeout: Duration::from_secs(self.grammar_compile_timeout.max(1)),
        }
    }

    /// The header, time and stream limits.
    pub fn server_limits(&self) -> ServerLimits {
        ServerLimits {
            request_timeout: secs(self.request_timeout),
            body_read_timeout: secs(self.body_read_timeout),
            max_header_bytes: self.max_header_bytes,
            stream_buffer_events: self.stream_buffer_events.max(1),
            stream_stall_timeout: Duration::from_secs(self.stream_stall_timeout),
        }
    }
}

/// `--port` when none is given.
pub const DEFAULT_PORT: u16 = 8000;

impl ServeArgs {
    /// What `--print-config` shows for the keys that no layer set and that have no
    /// fixed default: the values start-up derives (reading no model), or where they
    /// come from.
    pub fn derived_defaults(&self) -> Vec<(&'static str, Derived)> {
        let value = |v: toml_edit::Value| Derived::Value(v);
        let note = |s: &str| Derived::Note(s.to_string());
        let mut out = vec![
            ("port", value(i64::from(DEFAULT_PORT).into())),
            ("max_model_len", note("the model's context length")),
            (
                "tokenizer",
                note("the model's own (GGUF metadata, or the folder's tokenizer.json)"),
            ),
            ("chat_template", note("the tokenizer's")),
            ("tool_call_parser", note("chosen from the chat template")),
        ];
        let model = match &self.model.model {
            Some(m) => m.clone(),
            None => tessera_engine::default_model_path().display().to_string(),
        };
        out.push(("model", value(model.into())));
        match self.model.default_served_name() {
            Ok(name) => out.push((
                "served_model_name",
                value(toml_edit::Value::Array([name].into_iter().collect())),
            )),
            Err(e) => out.push(("served_model_name", Derived::Note(format!("{e:#}")))),
        }
        match self.model.devices() {
            Ok(devices) => {
                let cpu_only = devices.iter().all(|d| matches!(d, DeviceSpec::Cpu(_)));
                let list: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
                out.push(("devices", value(list.join(",").into())));
                out.push((
                    "max_batch_tokens",
                    value((default_max_batch_tokens(&devices) as i64).into()),
                ));
                if cpu_only && self.model.nodes.nnodes > 1 {
                    // Nodes of a group must agree on the cache: a fixed default.
                    out.push((
                        "kv_cache_memory_mib",
                        value((DEFAULT_CPU_KV_CACHE_MIB as i64).into()),
                    ));
                }
                if cpu_only && self.model.nodes.nnodes <= 1 {
                    out.push((
                        "kv_cache_memory_mib",
                        note("cpu_kv_cache_utilization of the memory left after the weights"),
                    ));
                }
                if cpu_only {
                    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                    let threads = (cores / devices.len().max(1)).max(1);
                    out.push(("threads_per_rank", value((threads as i64).into())));
                } else {
                    out.push((
                        "kv_cache_memory_mib",
                        note("what gpu_memory_utilization leaves after the weights and a profile step"),
                    ));
                }
            }
            Err(e) => out.push(("devices", Derived::Note(format!("{e:#}")))),
        }
        out
    }
}

/// `secs` seconds; 0 means no limit.
fn secs(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// Tokens per step when `--max-batch-tokens` is not given. On CPU ranks a prefill runs at
/// hundreds of tokens per second, so 256 tokens keep a step (and the pause it puts into
/// every running stream) under half a second; measured with 16 streaming clients of
/// ~124-token prompts, the median time to first token fell from 2.6 s to 1.0 s at the
/// same aggregate output rate (docs/benchmarks.md).
pub fn default_max_batch_tokens(devices: &[DeviceSpec]) -> usize {
    if devices.iter().all(|d| matches!(d, DeviceSpec::Cpu(_))) {
        256
    } else {
        2048
    }
}
