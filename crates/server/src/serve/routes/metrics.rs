//! `GET /metrics` in the Prometheus text format (0.0.4). Scheduler state and token
//! counters come from the engine loop's published snapshot; per-sequence latencies and
//! HTTP counts from what the server measures itself
//! ([`ServerMetrics`](crate::serve::metrics::ServerMetrics)). Names follow vLLM's where
//! the meaning is the same (`vllm:*`, with a `model_name` label), so vLLM dashboards
//! work; the rest are `tessera_*`.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use tessera_protocol::DurationHistogram;

use crate::serve::metrics::ServerMetrics;
use crate::serve::state::AppState;

/// Label values escaped per the text format.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Writer {
    text: String,
    /// `model_name="…"`, on every `vllm:*` sample as vLLM does.
    model_label: String,
}

impl Writer {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: f64) {
        if labels.is_empty() {
            let _ = writeln!(self.text, "{name} {value}");
        } else {
            let _ = writeln!(self.text, "{name}{{{labels}}} {value}");
        }
    }

    fn vllm(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.header(name, kind, help);
        let labels = self.model_label.clone();
        self.sample(name, &labels, value);
    }

    fn tessera(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.header(name, kind, help);
        self.sample(name, "", value);
    }

    /// A histogram from per-bucket (not cumulative) counts.
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &str,
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) {
        self.header(name, "histogram", help);
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        for (i, count) in counts.iter().enumerate() {
            cumulative += count;
            let le = bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let l = format!("{labels}{sep}le=\"{le}\"");
            self.sample(&format!("{name}_bucket"), &l, cumulative as f64);
        }
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, cumulative as f64);
    }

    fn server_histogram(&mut self, name: &str, help: &str, h: &DurationHistogram) {
        let s = h.snapshot();
        let labels = self.model_label.clone();
        self.histogram(
            name,
            help,
            &labels,
            s.bounds_seconds,
            &s.counts,
            s.sum_seconds,
        );
    }
}

/// The whole exposition.
pub fn render(app: &AppState) -> String {
    let m = app.scheduler.metrics();
    // Each request once: admitted and not yet run, or preempted and not yet restarted.
    let waiting = app.scheduler.num_waiting() as f64;
    let mut w = Writer {
        text: String::new(),
        model_label: format!("model_name=\"{}\"", escape(app.model_name())),
    };
    w.vllm(
        "vllm:num_requests_running",
        "gauge",
        "Sequences running in the engine.",
        m.num_running as f64,
    );
    w.vllm(
        "vllm:num_requests_waiting",
        "gauge",
        "Sequences waiting to start or restart (admitted, queued, preempted).",
        waiting,
    );
    w.vllm(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV cache usage as a fraction of all blocks (1 = full).",
        m.kv_usage_fraction,
    );
    w.vllm(
        "vllm:prompt_tokens_total",
        "counter",
        "Prompt tokens of sequences that started.",
        m.prompt_tokens_total as f64,
    );
    w.vllm(
        "vllm:generation_tokens_total",
        "counter",
        "Tokens generated.",
        m.generation_tokens_total as f64,
    );
    w.vllm(
        "vllm:num_preemptions_total",
        "counter",
        "Sequences preempted (KV blocks exhausted).",
        m.preemptions_total as f64,
    );
    w.vllm(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        m.prefix_cache_queries_tokens as f64,
    );
    w.vllm(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        m.prefix_cache_hits_tokens as f64,
    );
    let spec = &m.speculation;
    w.vllm(
        "vllm:spec_decode_num_drafts_total",
        "counter",
        "Sequence steps that carried speculative guesses.",
        spec.drafts as f64,
    );
    w.vllm(
        "vllm:spec_decode_num_draft_tokens_total",
        "counter",
        "Speculative guesses made.",
        spec.draft_tokens as f64,
    );
    w.vllm(
        "vllm:spec_decode_num_accepted_tokens_total",
        "counter",
        "Speculative guesses accepted (each a token gained).",
        spec.accepted_tokens as f64,
    );
    w.header(
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "counter",
        "Speculative guesses accepted, by position in the guess (0 first).",
    );
    for (position, n) in spec.accepted_per_position.iter().enumerate() {
        let labels = format!("{},position=\"{position}\"", w.model_label);
        w.sample(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            &labels,
            *n as f64,
        );
    }
    w.server_histogram(
        "vllm:time_to_first_token_seconds",
        "Seconds from submit to the first token, per sequence.",
        &app.metrics.time_to_first_token,
    );
    w.server_histogram(
        "vllm:inter_token_latency_seconds",
        "Seconds between consecutive tokens of a sequence.",
        &app.metrics.inter_token_latency,
    );
    w.server_histogram(
        "vllm:e2e_request_latency_seconds",
        "Seconds from submit to the end of a sequence.",
        &app.metrics.e2e_request_latency,
    );
    let queue = app.scheduler.queue_durations();
    let labels = w.model_label.clone();
    w.histogram(
        "vllm:request_queue_time_seconds",
        "Seconds from admission to a sequence's first step.",
        &labels,
        queue.bounds_seconds,
        &queue.counts,
        queue.sum_seconds,
    );

    // Earlier names of the two gauges above, kept so existing dashboards and the
    // README example keep working.
    w.tessera(
        "tessera_num_requests_running",
        "gauge",
        "Same as vllm:num_requests_running.",
        m.num_running as f64,
    );
    w.tessera(
        "tessera_num_requests_waiting",
        "gauge",
        "Same as vllm:num_requests_waiting.",
        waiting,
    );
    w.tessera(
        "tessera_kv_blocks_in_use",
        "gauge",
        "KV blocks held by sequences.",
        m.kv_blocks_in_use as f64,
    );
    w.tessera(
        "tessera_kv_blocks_total",
        "gauge",
        "KV blocks in the cache.",
        m.kv_blocks_total as f64,
    );
    w.tessera(
        "tessera_steps_total",
        "counter",
        "Engine steps applied.",
        m.steps_total as f64,
    );
    let health = app.scheduler.health();
    w.tessera(
        "tessera_step_failures_total",
        "counter",
        "Executor steps that failed.",
        health.step_failures_total as f64,
    );
    w.tessera(
        "tessera_in_flight_sequences",
        "gauge",
        "Sequences submitted whose response has not finished.",
        app.lifecycle.in_flight() as f64,
    );
    let steps = app.scheduler.step_durations();
    w.histogram(
        "tessera_step_duration_seconds",
        "Seconds per executor step.",
        "",
        steps.bounds_seconds,
        &steps.counts,
        steps.sum_seconds,
    );
    if let Some(stats) = &app.engine_stats {
        let ranks = stats.snapshot();
        let per_rank = [
            ("tessera_rank_steps_total", "Steps each rank ran.", 0),
            (
                "tessera_rank_graph_steps_total",
                "Of those, steps each rank replayed from a CUDA graph (decode steps; 0 with --enforce-eager).",
                3,
            ),
            ("tessera_rank_step_seconds_total", "Seconds each rank spent in steps.", 1),
            (
                "tessera_rank_collective_seconds_total",
                "Seconds each rank spent in collectives (all-reduce, all-gather), waiting for the other ranks included.",
                2,
            ),
        ];
        for (name, help, field) in per_rank {
            w.header(name, "counter", help);
            for (rank, s) in ranks.iter().enumerate() {
                let value = match field {
                    0 => s.steps as f64,
                    3 => s.graph_steps as f64,
                    1 => s.step_seconds,
                    _ => s.collective_seconds,
                };
                w.sample(name, &format!("rank=\"{rank}\""), value);
            }
        }
    }
    if let Some(grammar) = app.validation.grammar.compiler() {
        let masks = grammar.mask_times();
        w.histogram(
            "tessera_structured_output_mask_seconds",
            "Seconds to compute and apply one token mask of a sequence under a response_format or forced tool call (one per constrained token; _sum / _count is the mask time per token).",
            "",
            masks.bounds_seconds,
            &masks.counts,
            masks.sum_seconds,
        );
    }
    http_counts(&mut w, &app.metrics);
    w.text
}

/// `GET /metrics` while the model loads: the HTTP counts, the one thing measured before
/// the engine exists (scrapers see the server up, and what it has answered).
pub fn loading(server: &ServerMetrics) -> Response {
    let mut w = Writer {
        text: String::new(),
        model_label: String::new(),
    };
    http_counts(&mut w, server);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        w.text,
    )
        .into_response()
}

fn http_counts(w: &mut Writer, server: &ServerMetrics) {
    let http = server.http_counts();
    w.header(
        "tessera_http_requests_total",
        "counter",
        "HTTP responses by route template and status.",
    );
    for ((route, status), count) in http {
        let labels = format!("route=\"{}\",status=\"{status}\"", escape(route));
        w.sample("tessera_http_requests_total", &labels, count as f64);
    }
}

/// `GET /metrics`.
pub async fn metrics(State(app): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(&app),
    )
        .into_response()
}
