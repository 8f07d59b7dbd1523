//! `/health` answers carry the launcher's launch id; no other route does.

use axum::body::Body;
use axum::http::{HeaderValue, Request};
use tower::ServiceExt;

use super::{handler_config, ok_backend, test_state};
use crate::http::app;
use crate::http::middleware::launch_identity::LAUNCH_ID_HEADER;

async fn launch_id_header(app: &axum::Router, path: &str) -> Option<String> {
    let request = Request::get(path).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let header = response.headers().get(LAUNCH_ID_HEADER)?;
    Some(header.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn health_answers_carry_the_launch_id_and_no_other_route_does() {
    let state = test_state(ok_backend(), handler_config(4));
    let with_id = app(state
        .clone()
        .with_launch_id(Some(HeaderValue::from_static("3f9a0c"))));
    assert_eq!(
        launch_id_header(&with_id, "/health").await.as_deref(),
        Some("3f9a0c")
    );
    assert_eq!(launch_id_header(&with_id, "/info").await, None);
    assert_eq!(launch_id_header(&app(state), "/health").await, None);
}
