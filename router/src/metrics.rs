//! Prometheus exposition: the recorder, every metric's description, per-request recording.

use std::time::{Duration, Instant};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, histogram, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
const COUNT_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];
/// How often idle histogram buckets are compacted.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// A recorder with real Prometheus histograms (not summaries) for every histogram we emit.
fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full("tandem_generated_tokens".to_owned()),
            COUNT_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("tandem_input_tokens".to_owned()),
            COUNT_BUCKETS,
        )?
        .set_buckets_for_metric(Matcher::Full("tandem_batch_size".to_owned()), COUNT_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full("tandem_batch_tokens".to_owned()),
            COUNT_BUCKETS,
        )
}

/// Installs the process-wide recorder, describes every metric and starts its upkeep task.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            ticks.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// A handle to a recorder that is not installed: renders nothing, for tests.
pub fn detached_handle() -> PrometheusHandle {
    PrometheusBuilder::new().build_recorder().handle()
}

fn describe() {
    describe_counter!(
        "tandem_request_count",
        "Generation requests received, by route"
    );
    describe_counter!(
        "tandem_request_success",
        "Generation requests that completed"
    );
    describe_counter!(
        "tandem_request_failure",
        "Generation requests that failed, by reason"
    );
    describe_histogram!(
        "tandem_request_duration_seconds",
        Unit::Seconds,
        "End-to-end request latency"
    );
    describe_histogram!(
        "tandem_time_to_first_token_seconds",
        Unit::Seconds,
        "Time from arrival to the first generated token"
    );
    describe_histogram!(
        "tandem_inter_token_latency_seconds",
        Unit::Seconds,
        "Time between consecutive generated tokens of one request"
    );
    describe_histogram!("tandem_generated_tokens", "Tokens generated per request");
    describe_histogram!("tandem_input_tokens", "Prompt tokens per request");
    describe_scheduler();
}

/// The scheduler emits these; their descriptions live here with the rest.
fn describe_scheduler() {
    describe_gauge!("tandem_queue_size", "Requests waiting to be scheduled");
    describe_gauge!("tandem_running_requests", "Requests being generated");
    describe_gauge!("tandem_kv_blocks_used", "KV cache blocks in use");
    describe_gauge!("tandem_kv_blocks_total", "KV cache blocks in the pool");
    describe_counter!(
        "tandem_preemptions_total",
        "Requests preempted for lack of KV blocks"
    );
    describe_counter!(
        "tandem_cancelled_requests_total",
        "Requests cancelled before finishing"
    );
    describe_histogram!("tandem_batch_size", "Requests per step");
    describe_histogram!("tandem_batch_tokens", "Tokens per step");
    describe_histogram!(
        "tandem_step_duration_seconds",
        Unit::Seconds,
        "Duration of one step across all shards"
    );
}

/// Records one generation request's lifecycle; a request dropped before an outcome
/// (client gone) counts as a failure with reason `cancelled`.
#[derive(Debug)]
pub struct RequestMetrics {
    route: &'static str,
    started: Instant,
    last_token: Option<Instant>,
    generated_tokens: usize,
    finished: bool,
}

impl RequestMetrics {
    /// Counts a request arriving on `route`.
    pub fn start(route: &'static str) -> Self {
        counter!("tandem_request_count", "route" => route).increment(1);
        Self {
            route,
            started: Instant::now(),
            last_token: None,
            generated_tokens: 0,
            finished: false,
        }
    }

    /// Records the prompt length once it is known.
    pub fn input_tokens(&self, count: usize) {
        histogram!("tandem_input_tokens", "route" => self.route).record(as_f64(count));
    }

    /// Records one generated token's timing.
    pub fn token(&mut self) {
        let now = Instant::now();
        match self.last_token {
            None => histogram!("tandem_time_to_first_token_seconds", "route" => self.route)
                .record(now - self.started),
            Some(previous) => {
                histogram!("tandem_inter_token_latency_seconds", "route" => self.route)
                    .record(now - previous);
            }
        }
        self.last_token = Some(now);
        self.generated_tokens += 1;
    }

    /// Tokens generated so far.
    pub fn generated_tokens(&self) -> usize {
        self.generated_tokens
    }

    /// Records a completed request.
    pub fn succeed(mut self) {
        self.finished = true;
        counter!("tandem_request_success", "route" => self.route).increment(1);
        histogram!("tandem_request_duration_seconds", "route" => self.route)
            .record(self.started.elapsed());
        histogram!("tandem_generated_tokens", "route" => self.route)
            .record(as_f64(self.generated_tokens));
    }

    /// Records a failed request.
    pub fn fail(mut self, reason: &'static str) {
        self.record_failure(reason);
    }

    fn record_failure(&mut self, reason: &'static str) {
        self.finished = true;
        counter!("tandem_request_failure", "route" => self.route, "reason" => reason).increment(1);
    }
}

impl Drop for RequestMetrics {
    fn drop(&mut self) {
        if !self.finished {
            self.record_failure("cancelled");
        }
    }
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(count: usize) -> f64 {
    count as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_metrics_render_as_prometheus_histograms_and_counters() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mut ok = RequestMetrics::start("generate");
            ok.token();
            ok.token();
            ok.succeed();
            drop(RequestMetrics::start("generate"));
        });
        let text = handle.render();
        assert!(
            text.contains(r#"tandem_request_count{route="generate"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tandem_request_success{route="generate"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tandem_request_failure{route="generate",reason="cancelled"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("tandem_time_to_first_token_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains(r#"tandem_generated_tokens_sum{route="generate"} 2"#),
            "{text}"
        );
    }
}
