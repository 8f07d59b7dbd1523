//! One generation request's lifecycle: arrival, admission, tokens, outcome.

use std::time::Instant;

use metrics::{counter, histogram};

use super::as_f64;
use crate::tenant::{KeyName, Tenant};

/// The `key` label of requests whose key has no name in the key file (and of inline keys).
pub const UNNAMED_KEY: &str = "unnamed";

/// Records one generation request's lifecycle; a request dropped before an outcome
/// (client gone) counts as a failure with reason `cancelled`.
#[derive(Debug)]
pub struct RequestMetrics {
    route: &'static str,
    /// The `key` label of the per-key series: the caller's key name from the key file, or
    /// `unnamed`; `None` when no keys are configured (no per-key series).
    key: Option<&'static str>,
    started: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// The `finish_reason` label of the last token, once it came.
    finish: Option<&'static str>,
    generated_tokens: usize,
    finished: bool,
}

impl RequestMetrics {
    /// Counts a request arriving on `route` from `tenant`.
    pub fn start(route: &'static str, tenant: Option<Tenant>) -> Self {
        counter!("tandem_requests_total", "route" => route).increment(1);
        let key = tenant.map(|tenant| tenant.name.map_or(UNNAMED_KEY, KeyName::as_str));
        if let Some(key) = key {
            counter!("tandem_key_requests_total", "key" => key).increment(1);
        }
        Self {
            route,
            key,
            started: Instant::now(),
            admitted: None,
            first_token: None,
            last_token: None,
            finish: None,
            generated_tokens: 0,
            finished: false,
        }
    }

    /// Records the prompt length once the request is admitted.
    pub fn input_tokens(&self, count: usize) {
        histogram!("tandem_request_input_tokens", "route" => self.route).record(as_f64(count));
        counter!("tandem_prompt_tokens_total", "route" => self.route).increment(count as u64);
        if let Some(key) = self.key {
            counter!("tandem_key_prompt_tokens_total", "key" => key).increment(count as u64);
        }
    }

    /// Records how many images the admitted request's prompt carries.
    pub fn images(&self, count: usize) {
        histogram!("tandem_request_images", "route" => self.route).record(as_f64(count));
    }

    /// Records one delivered token; `admitted` is when the scheduler first admitted the
    /// request, `finish` (the `finish_reason` label) is set on the last token.
    pub fn token(&mut self, admitted: Option<Instant>, finish: Option<&'static str>) {
        let now = Instant::now();
        match self.last_token {
            None => {
                histogram!("tandem_time_to_first_token_seconds", "route" => self.route)
                    .record(now - self.started);
                self.first_token = Some(now);
                self.admitted = admitted;
                if let (Some(key), Some(admitted)) = (self.key, admitted) {
                    histogram!("tandem_key_queue_duration_seconds", "key" => key)
                        .record(admitted.saturating_duration_since(self.started));
                }
            }
            Some(previous) => {
                histogram!("tandem_inter_token_latency_seconds", "route" => self.route)
                    .record(now - previous);
            }
        }
        counter!("tandem_generated_tokens_total", "route" => self.route).increment(1);
        if let Some(key) = self.key {
            counter!("tandem_key_generated_tokens_total", "key" => key).increment(1);
        }
        self.last_token = Some(now);
        self.generated_tokens += 1;
        self.finish = finish.or(self.finish);
    }

    /// Tokens generated so far.
    pub fn generated_tokens(&self) -> usize {
        self.generated_tokens
    }

    /// Records a completed request.
    pub fn succeed(mut self) {
        self.finished = true;
        let finish = self.finish.unwrap_or("unknown");
        counter!("tandem_request_success_total", "route" => self.route, "finish_reason" => finish)
            .increment(1);
        histogram!("tandem_request_duration_seconds", "route" => self.route)
            .record(self.started.elapsed());
        histogram!("tandem_request_generated_tokens", "route" => self.route)
            .record(as_f64(self.generated_tokens));
        self.record_phases();
    }

    /// Prefill, decode and per-output-token time of a request that produced tokens.
    fn record_phases(&self) {
        let (Some(first), Some(last)) = (self.first_token, self.last_token) else {
            return;
        };
        if let Some(admitted) = self.admitted {
            histogram!("tandem_request_prefill_duration_seconds", "route" => self.route)
                .record(first.saturating_duration_since(admitted));
        }
        let decode = last - first;
        histogram!("tandem_request_decode_duration_seconds", "route" => self.route).record(decode);
        if self.generated_tokens > 1 {
            let per_token = decode.as_secs_f64() / as_f64(self.generated_tokens - 1);
            histogram!("tandem_time_per_output_token_seconds", "route" => self.route)
                .record(per_token);
        }
    }

    /// Records a failed request.
    pub fn fail(mut self, reason: &'static str) {
        self.record_failure(reason);
    }

    fn record_failure(&mut self, reason: &'static str) {
        self.finished = true;
        counter!("tandem_request_failure_total", "route" => self.route, "reason" => reason)
            .increment(1);
    }
}

impl Drop for RequestMetrics {
    fn drop(&mut self) {
        if !self.finished {
            self.record_failure("cancelled");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(record: impl FnOnce()) -> String {
        let recorder = super::super::builder()
            .expect("buckets are valid")
            .build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, record);
        handle.render()
    }

    #[test]
    fn completed_and_dropped_requests_render_as_counters_and_histograms() {
        let text = render(|| {
            let mut ok = RequestMetrics::start("generate", None);
            ok.input_tokens(5);
            let admitted = Some(Instant::now());
            ok.token(admitted, None);
            ok.token(admitted, None);
            ok.token(admitted, Some("length"));
            ok.succeed();
            drop(RequestMetrics::start("generate", None));
        });
        for expected in [
            r#"tandem_requests_total{route="generate"} 2"#,
            r#"tandem_request_success_total{route="generate",finish_reason="length"} 1"#,
            r#"tandem_request_failure_total{route="generate",reason="cancelled"} 1"#,
            r#"tandem_prompt_tokens_total{route="generate"} 5"#,
            r#"tandem_generated_tokens_total{route="generate"} 3"#,
            r#"tandem_request_generated_tokens_sum{route="generate"} 3"#,
            r#"tandem_time_to_first_token_seconds_count{route="generate"} 1"#,
            r#"tandem_inter_token_latency_seconds_count{route="generate"} 2"#,
            r#"tandem_time_per_output_token_seconds_count{route="generate"} 1"#,
            r#"tandem_request_prefill_duration_seconds_count{route="generate"} 1"#,
            r#"tandem_request_decode_duration_seconds_count{route="generate"} 1"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
    }

    #[test]
    fn requests_with_a_key_count_by_its_name_and_without_keys_by_none() {
        let named = Tenant {
            name: Some(KeyName::intern(
                "team-a",
                &mut std::collections::HashSet::new(),
            )),
            ..Tenant::unweighted(crate::tenant::KeyId::of(b"sk-a"))
        };
        let unnamed = Tenant::unweighted(crate::tenant::KeyId::of(b"sk-b"));
        let text = render(|| {
            let mut request = RequestMetrics::start("completions", Some(named));
            request.input_tokens(7);
            request.token(Some(Instant::now()), None);
            request.token(None, Some("length"));
            request.succeed();
            RequestMetrics::start("completions", Some(unnamed)).fail("validation");
            RequestMetrics::start("completions", None).fail("validation");
        });
        for expected in [
            r#"tandem_key_requests_total{key="team-a"} 1"#,
            r#"tandem_key_requests_total{key="unnamed"} 1"#,
            r#"tandem_key_prompt_tokens_total{key="team-a"} 7"#,
            r#"tandem_key_generated_tokens_total{key="team-a"} 2"#,
            r#"tandem_key_queue_duration_seconds_count{key="team-a"} 1"#,
            r#"tandem_requests_total{route="completions"} 3"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        assert_eq!(
            text.matches("tandem_key_requests_total{").count(),
            2,
            "{text}"
        );
    }

    #[test]
    fn a_single_token_request_has_no_time_per_output_token() {
        let text = render(|| {
            let mut one = RequestMetrics::start("completions", None);
            one.token(None, Some("eos_token"));
            one.succeed();
        });
        assert!(text.contains(r#"finish_reason="eos_token"} 1"#), "{text}");
        assert!(!text.contains("tandem_time_per_output_token_seconds_count"));
        assert!(!text.contains("tandem_request_prefill_duration_seconds_count"));
    }
}
