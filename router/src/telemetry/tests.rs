use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue};
use opentelemetry::trace::{SpanId, SpanKind, Status, TraceContextExt, TraceId};

use super::propagation::traceparent_of;
use super::testing::tracing;
use super::*;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn headers(traceparent: &[&str]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for value in traceparent {
        headers.append(
            TRACEPARENT,
            HeaderValue::from_str(value).expect("a header value"),
        );
    }
    headers
}

fn client_traceparent(flags: &str) -> String {
    format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}")
}

fn trace_id(hex: &str) -> TraceId {
    TraceId::from_hex(hex).expect("a trace id")
}

#[test]
fn a_valid_traceparent_is_the_clients_span() {
    let parsed = parse_traceparent(&headers(&[&client_traceparent("01")])).expect("valid");
    assert_eq!(parsed.trace_id(), trace_id(CLIENT_TRACE));
    assert_eq!(
        parsed.span_id(),
        SpanId::from_hex(CLIENT_SPAN).expect("a span id")
    );
    assert!(parsed.is_sampled() && parsed.is_remote());
    let unsampled = parse_traceparent(&headers(&[&client_traceparent("00")])).expect("valid");
    assert!(!unsampled.is_sampled());
}

#[test]
fn a_missing_malformed_or_repeated_traceparent_is_ignored() {
    let zero_trace = format!("00-{}-{CLIENT_SPAN}-01", "0".repeat(32));
    let zero_span = format!("00-{CLIENT_TRACE}-{}-01", "0".repeat(16));
    let valid = client_traceparent("01");
    let malformed = [
        "",
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
        "00-xyz92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        zero_trace.as_str(),
        zero_span.as_str(),
    ];
    assert_eq!(parse_traceparent(&HeaderMap::new()), None);
    for value in malformed {
        assert_eq!(parse_traceparent(&headers(&[value])), None, "{value:?}");
    }
    assert_eq!(parse_traceparent(&headers(&[&valid, &valid])), None);
}

#[test]
fn the_http_span_continues_the_clients_trace_or_starts_one() {
    let (tracing, collected) = tracing(1.0);
    let traced = HttpTrace::start_in(
        tracing,
        "POST",
        "/v1/completions",
        &headers(&[&client_traceparent("01")]),
        Some("req-1"),
    );
    traced.respond(200);
    drop(traced);
    let span = collected.named("POST /v1/completions");
    assert_eq!(span.span_context.trace_id(), trace_id(CLIENT_TRACE));
    assert_eq!(
        span.parent_span_id,
        SpanId::from_hex(CLIENT_SPAN).expect("span id")
    );
    assert_eq!(span.span_kind, SpanKind::Server);
    assert_eq!(span.status, Status::Unset);
    let malformed = HttpTrace::start_in(tracing, "POST", "/generate", &headers(&["bad"]), None);
    malformed.respond(503);
    drop(malformed);
    let span = collected.named("POST /generate");
    assert_ne!(span.span_context.trace_id(), trace_id(CLIENT_TRACE));
    assert_eq!(span.parent_span_id, SpanId::INVALID);
    assert!(matches!(span.status, Status::Error { .. }));
}

#[test]
fn a_client_that_does_not_sample_is_not_traced() {
    let (tracing, collected) = tracing(1.0);
    let traced = HttpTrace::start_in(
        tracing,
        "POST",
        "/v1/chat/completions",
        &headers(&[&client_traceparent("00")]),
        None,
    );
    let mut generation = GenerationTrace::start_in(tracing, traced.context(), 0, 5);
    generation.token(Some(Instant::now()), Some("length"));
    generation.succeed();
    drop(traced);
    assert!(collected.spans().is_empty(), "{:?}", collected.spans());
}

#[test]
fn a_generation_records_its_stages_in_order_under_its_span() {
    let (tracing, collected) = tracing(1.0);
    let traced = HttpTrace::start_in(tracing, "POST", "/generate", &HeaderMap::new(), None);
    let mut generation = GenerationTrace::start_in(tracing, traced.context(), 1, 5);
    std::thread::sleep(Duration::from_millis(2));
    let admitted = Instant::now();
    std::thread::sleep(Duration::from_millis(2));
    generation.token(Some(admitted), None);
    generation.token(None, None);
    generation.token(None, Some("length"));
    generation.succeed();
    drop(traced);
    let root = collected.named("POST /generate");
    let parent = collected.named("generation");
    assert_eq!(parent.parent_span_id, root.span_context.span_id());
    let [queue, prefill, decode] = ["queue", "prefill", "decode"].map(|name| collected.named(name));
    for stage in [&queue, &prefill, &decode] {
        assert_eq!(stage.parent_span_id, parent.span_context.span_id());
        assert_eq!(stage.span_context.trace_id(), root.span_context.trace_id());
        assert!(stage.start_time <= stage.end_time);
    }
    assert!(queue.end_time <= prefill.start_time + Duration::from_millis(1));
    assert!(prefill.end_time <= decode.start_time);
    assert!(queue.end_time > queue.start_time, "the request waited");
    let output_tokens = parent
        .attributes
        .iter()
        .find(|attribute| attribute.key.as_str() == "gen_ai.usage.output_tokens")
        .map(|attribute| attribute.value.clone());
    assert_eq!(output_tokens, Some(opentelemetry::Value::I64(3)));
}

#[test]
fn a_cancelled_generation_ends_failed_and_leaves_the_registry() {
    let (tracing, collected) = tracing(1.0);
    let traced = HttpTrace::start_in(tracing, "POST", "/generate", &HeaderMap::new(), None);
    let generation = GenerationTrace::start_in(tracing, traced.context(), 0, 5);
    let handle = generation.request_trace().expect("traced");
    handle.bind(41);
    assert_eq!(tracing.steps().len(), 1);
    drop(generation);
    drop(handle);
    assert!(tracing.steps().is_empty());
    assert!(matches!(
        collected.named("generation").status,
        Status::Error { .. }
    ));
    assert!(matches!(
        collected.named("queue").status,
        Status::Error { .. }
    ));
}

#[test]
fn a_step_links_the_sampled_requests_it_runs_and_carries_its_traceparent() {
    let (tracing, collected) = tracing(0.0);
    let client = headers(&[&client_traceparent("01")]);
    let traced = HttpTrace::start_in(tracing, "POST", "/generate", &client, None);
    let generation = GenerationTrace::start_in(tracing, traced.context(), 0, 5);
    let handle = generation.request_trace().expect("traced");
    handle.bind(7);
    let shape = StepShape {
        step_id: 3,
        requests: 2,
        new_requests: 1,
        tokens: 9,
    };
    assert!(tracing.start_step(shape, [8].into_iter()).is_none());
    let step = tracing
        .start_step(shape, [7, 8].into_iter())
        .expect("runs a sampled request");
    let traceparent = traceparent_of(step.context()).expect("sampled");
    let span_context = step.context().span().span_context().clone();
    assert_eq!(
        traceparent.to_str().expect("ascii"),
        format!(
            "00-{}-{}-01",
            span_context.trace_id(),
            span_context.span_id()
        )
    );
    drop(step);
    let step = collected.named("step");
    assert_eq!(step.parent_span_id, SpanId::INVALID);
    assert_eq!(step.links.links.len(), 1);
    let link = &step.links.links[0];
    assert_eq!(link.span_context.trace_id(), trace_id(CLIENT_TRACE));
    assert_eq!(link.span_context.span_id(), handle_span(&handle));
}

fn handle_span(handle: &RequestTrace) -> SpanId {
    let shown = format!("{handle:?}");
    assert!(shown.contains(CLIENT_TRACE), "{shown}");
    handle.span_id()
}

#[test]
fn unsampled_roots_are_dropped_at_ratio_zero() {
    let (tracing, collected) = tracing(0.0);
    let traced = HttpTrace::start_in(tracing, "POST", "/generate", &HeaderMap::new(), None);
    assert!(!traced.context().span().span_context().is_sampled());
    let generation = GenerationTrace::start_in(tracing, traced.context(), 0, 5);
    assert!(generation.request_trace().is_none());
    drop(traced);
    assert!(collected.spans().is_empty());
}

#[test]
fn nothing_is_traced_while_tracing_is_off() {
    assert!(active().is_none());
    assert!(current_traceparent().is_none());
    assert!(HttpTrace::start("POST", "/generate", &HeaderMap::new(), None).is_none());
    assert!(GenerationTrace::start(0, 5).request_trace().is_none());
    let args = OtlpArgs {
        otlp_endpoint: None,
        otlp_sample_ratio: 1.0,
        otlp_service_name: "tandem.router".to_owned(),
    };
    assert!(init(&args).expect("no endpoint").is_none());
    assert!(active().is_none());
}
