//! Liveness, readiness and refusals while the shards restart or the server drains.

use std::sync::Mutex;

use axum::http::header;
use serde_json::Value;

use super::*;
use crate::error::RETRY_AFTER_SECS;
use crate::scheduler::EnginePhase;
use crate::validation::ChatUnavailable;

/// The scripted fake, in a phase the test chooses.
struct PhasedBackend {
    inner: Arc<FakeBackend>,
    phase: Mutex<EnginePhase>,
}

#[async_trait::async_trait]
impl Backend for PhasedBackend {
    fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, SchedulerError> {
        self.inner.submit(request)
    }

    fn load(&self) -> LoadSnapshot {
        self.inner.load()
    }

    async fn health(&self) -> Result<(), SchedulerError> {
        self.inner.health().await
    }

    fn phase(&self) -> EnginePhase {
        *self.phase.lock().unwrap()
    }
}

fn state_over(inner: Arc<FakeBackend>, phase: EnginePhase) -> AppState {
    let dir = testing::chat_model_dir();
    let files = ModelFiles::load(dir.path()).unwrap();
    let tokenizer = Arc::new(files.tokenizer);
    let limits = Limits {
        max_stop_sequences: 4,
        max_input_tokens: MAX_INPUT_TOKENS,
        max_total_tokens: MAX_TOTAL_TOKENS,
    };
    let validator = Validator::new(
        Arc::clone(&tokenizer),
        Err(ChatUnavailable::Disabled),
        limits,
    );
    let backend = Arc::new(PhasedBackend {
        inner,
        phase: Mutex::new(phase),
    });
    AppState::new(
        backend,
        Arc::new(validator),
        Arc::new(TokenDecoding::new(tokenizer)),
        handler_config(4),
        server_info_for(&handler_config(4)),
        crate::metrics::detached_handle(),
    )
}

const COMPLETION: &str = r#"{"prompt": "hello", "max_tokens": 3}"#;
const GENERATE: &str = r#"{"inputs": "hello", "parameters": {"max_new_tokens": 3}}"#;

async fn post_with_headers(app: &axum::Router, path: &str, body: &str) -> (Reply, Option<String>) {
    let response = app.clone().oneshot(post_request(path, body)).await.unwrap();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|value| value.to_str().unwrap().to_owned());
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let reply = Reply {
        status,
        content_type: String::new(),
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    };
    (reply, retry_after)
}

#[tokio::test]
async fn recovering_refuses_new_requests_with_503_and_retry_after_in_each_routes_shape() {
    let backend = ok_backend();
    let app = app(state_over(backend.clone(), EnginePhase::Recovering));
    let (reply, retry_after) = post_with_headers(&app, "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after, Some(RETRY_AFTER_SECS.to_string()));
    let error = &reply.json()["error"];
    assert_eq!(error["type"], "service_unavailable");
    assert_eq!(
        error["message"],
        "the model shards are restarting; retry shortly"
    );
    assert!(error.get("param").is_some() && error.get("code").is_some());
    let (reply, retry_after) = post_with_headers(&app, "/generate_stream", GENERATE).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after, Some(RETRY_AFTER_SECS.to_string()));
    assert_eq!(reply.json()["error_type"], "unhealthy");
    assert!(
        backend.requests.lock().unwrap().is_empty(),
        "nothing was queued"
    );
}

#[tokio::test]
async fn recovering_fails_health_and_readiness() {
    let app = app(state_over(ok_backend(), EnginePhase::Recovering));
    let health = get(&app, "/health").await;
    assert_eq!(health.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(health.json()["status"], "recovering");
    assert_eq!(health.json()["error_type"], "unhealthy");
    let ready = get(&app, "/ready").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready.json()["status"], "recovering");
}

#[tokio::test]
async fn serving_is_healthy_and_ready() {
    let app = app(state_over(ok_backend(), EnginePhase::Serving));
    let health = get(&app, "/health").await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json()["status"], "ok");
    assert_eq!(health.json()["running_requests"], 0);
    let ready = get(&app, "/ready").await;
    assert_eq!(
        (ready.status, ready.json()["status"].clone()),
        (StatusCode::OK, Value::from("ready"))
    );
}

#[tokio::test]
async fn draining_stays_live_but_not_ready_and_refuses_new_requests() {
    let state = state_over(ok_backend(), EnginePhase::Serving);
    let app = app(state.clone());
    state.draining.start();
    let health = get(&app, "/health").await;
    assert_eq!(
        (health.status, health.json()["status"].clone()),
        (StatusCode::OK, Value::from("draining"))
    );
    let ready = get(&app, "/ready").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready.json()["status"], "draining");
    let (reply, retry_after) = post_with_headers(&app, "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("5"));
    assert_eq!(
        reply.json()["error"]["message"],
        "the server is shutting down"
    );
}

#[tokio::test]
async fn a_stream_started_before_the_drain_runs_to_its_end() {
    let backend = FakeBackend::new(Script::Hold(ids("a")));
    let state = state_over(backend.clone(), EnginePhase::Serving);
    let app = app(state.clone());
    let response = app
        .clone()
        .oneshot(post_request("/generate_stream", GENERATE))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    state.draining.start();
    assert_eq!(state.in_flight(), 1);
    let last = GenerationEvent::Token(GeneratedToken {
        id: ids("b")[0],
        logprob: -0.5,
        top_logprobs: Vec::new(),
        finish: Some(FinishReason::Length),
    });
    backend.senders.lock().unwrap()[0].send(last).unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains(r#""finish_reason":"length""#), "{text}");
    assert_eq!(state.in_flight(), 0);
}

#[tokio::test]
async fn a_queue_timeout_is_503_with_retry_after() {
    let backend = FakeBackend::new(Script::FailAfter(vec![], SchedulerError::QueueTimeout(60)));
    let app = app(state_over(backend, EnginePhase::Serving));
    let (reply, retry_after) = post_with_headers(&app, "/generate", GENERATE).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry_after.is_some());
    assert_eq!(
        reply.json()["error"],
        "the request waited 60s in the queue without starting (--max-queue-time); retry later"
    );
}

/// Everything this test binary logs, once the capturing subscriber is installed. A global
/// subscriber (not a per-thread one) so concurrent tests cannot race its callsite interest.
fn captured_logs() -> &'static Captured {
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("invariant: no other test installs a global subscriber");
        captured
    })
}

/// Log output, shared by every clone.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log lines of one `/generate` call, found by its request id.
async fn logs_of_one_generate(log_requests: bool, request_id: &str, prompt: &str) -> String {
    let captured = captured_logs();
    let state = state_over(ok_backend(), EnginePhase::Serving).with_request_logging(log_requests);
    let body = format!(r#"{{"inputs": "{prompt}", "parameters": {{"max_new_tokens": 3}}}}"#);
    let mut request = post_request("/generate", &body);
    request
        .headers_mut()
        .insert("x-request-id", request_id.parse().unwrap());
    // Another test may have registered a callsite while the subscriber was being installed.
    tracing::callsite::rebuild_interest_cache();
    let reply = send(&app(state), request).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    // The response line may be written just after the reply reaches the client.
    for _ in 0..100 {
        let lines = request_lines(captured, request_id);
        if lines.contains("response") {
            return lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    request_lines(captured, request_id)
}

fn request_lines(captured: &Captured, request_id: &str) -> String {
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    logs.lines()
        .filter(|line| line.contains(request_id))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn prompts_and_outputs_are_logged_only_with_log_requests() {
    let quiet = logs_of_one_generate(false, "quiet-request", "quiet secret").await;
    assert!(quiet.contains("response"), "{quiet}");
    assert!(
        !quiet.contains("quiet secret") && !quiet.contains("generated_text"),
        "{quiet}"
    );
    let logged = logs_of_one_generate(true, "logged-request", "logged secret").await;
    assert!(logged.contains("logged secret"), "{logged}");
    assert!(logged.contains("generated_text"), "{logged}");
}

#[tokio::test]
async fn deep_health_runs_a_forward_only_when_asked() {
    use std::sync::atomic::Ordering;
    let backend = ok_backend();
    let app = test_app(backend.clone(), 4);
    assert_eq!(get(&app, "/health").await.status, StatusCode::OK);
    assert_eq!(backend.deep_probes.load(Ordering::SeqCst), 0);
    let reply = get(&app, "/health?deep=true").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["status"], "ok");
    assert_eq!(backend.deep_probes.load(Ordering::SeqCst), 1);
    let reply = get(&app, "/health?deep=maybe").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.body.contains("deep"), "{}", reply.body);
}

#[tokio::test]
async fn a_deep_probe_without_an_answer_in_time_is_503_unhealthy() {
    let backend = FakeBackend::deep_failing(SchedulerError::HealthTimeout(5));
    let app = test_app(backend, 4);
    let reply = get(&app, "/health?deep=true").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let body = reply.json();
    assert_eq!(body["error_type"], "unhealthy");
    assert_eq!(
        body["error"],
        "the model is not healthy: the deep health check got no answer within 5s"
    );
    assert_eq!(get(&app, "/health").await.status, StatusCode::OK);
}
