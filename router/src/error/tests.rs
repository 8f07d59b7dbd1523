//! Each error's status and body on the OpenAI and native routes.

use super::*;
use crate::scheduler::RequestFailure;

#[test]
fn validation_errors_are_400_on_openai_and_422_native() {
    let error = AppError::Validation(ValidationError::Missing("messages"));
    assert_eq!(status(Api::OpenAi, error.kind()), StatusCode::BAD_REQUEST);
    assert_eq!(
        status(Api::Native, error.kind()),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let body = error_body(Api::OpenAi, &error);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["param"], "messages");
    assert_eq!(body["error"]["code"], Value::Null);
    let body = error_body(Api::Native, &error);
    assert_eq!(body["error_type"], "validation");
    assert_eq!(body["error"], "`messages` is required");
}

#[test]
fn shard_failures_are_424_native_and_500_openai() {
    let error = AppError::Scheduler(SchedulerError::ShardFailed("boom".into()));
    assert_eq!(
        status(Api::Native, error.kind()),
        StatusCode::FAILED_DEPENDENCY
    );
    assert_eq!(
        status(Api::OpenAi, error.kind()),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(error.metric_reason(), "shard_error");
    let timeout = AppError::Stream(StreamError::Scheduler(SchedulerError::QueueTimeout(5)));
    assert_eq!(timeout.metric_reason(), "timeout");
    assert_eq!(AppError::Overloaded(4).metric_reason(), "overloaded");
}

#[test]
fn a_request_failed_by_its_own_constraints_is_a_4xx_and_by_its_logits_a_5xx() {
    let failed = |kind| {
        AppError::Stream(StreamError::Scheduler(SchedulerError::RequestFailed(
            RequestFailure {
                kind,
                message: "no token is left".into(),
            },
        )))
    };
    let constrained = failed(RequestFailureKind::NoValidToken);
    assert_eq!(
        status(Api::OpenAi, constrained.kind()),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status(Api::Native, constrained.kind()),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        error_body(Api::OpenAi, &constrained)["error"]["message"],
        "no token is left"
    );
    assert_eq!(constrained.metric_reason(), "validation");
    let model = failed(RequestFailureKind::Model);
    assert_eq!(
        status(Api::OpenAi, model.kind()),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        status(Api::Native, model.kind()),
        StatusCode::FAILED_DEPENDENCY
    );
    let adapter = failed(RequestFailureKind::AdapterUnavailable);
    assert_eq!(
        status(Api::OpenAi, adapter.kind()),
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[test]
fn shutdown_is_503_and_overload_is_429() {
    let shutting = AppError::Stream(StreamError::Scheduler(SchedulerError::ShuttingDown));
    assert_eq!(
        status(Api::OpenAi, shutting.kind()),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let overloaded = AppError::Overloaded(4);
    assert_eq!(
        status(Api::Native, overloaded.kind()),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        error_body(Api::Native, &overloaded)["error_type"],
        "overloaded"
    );
    assert_eq!(
        error_body(Api::OpenAi, &overloaded)["error"]["type"],
        "overloaded"
    );
}

#[test]
fn an_unknown_stored_id_is_404_naming_its_parameter() {
    let error = AppError::NotFound {
        what: "Previous response",
        id: "resp_x".into(),
        param: Some("previous_response_id"),
    };
    let response = error_response(Api::OpenAi, &error);
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body = error_body(Api::OpenAi, &error);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["param"], "previous_response_id");
    assert_eq!(
        body["error"]["message"],
        "Previous response with id 'resp_x' not found"
    );
    assert_eq!(error.metric_reason(), "validation");
}
